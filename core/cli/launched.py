"""The entry point of each process that hydrali starts for a job (core/distributed/local_launch.py):

python -m hydrali.core.cli.launched <run dir>/.launch
"""

from __future__ import annotations

import json
import logging
import logging.config
import os
import sys
from pathlib import Path

from omegaconf import OmegaConf

from hydrali.core.cli.exit_codes import EXIT_SIGNAL_BASE
from hydrali.core.config.store import register_schemas
from hydrali.core.distributed.launchers import TORCHRUN
from hydrali.core.distributed.local_launch import CONFIG_FILE, CONTEXT_FILE, LOGGING_FILE
from hydrali.core.errors import HydraliError
from hydrali.core.process import collector, job_context, live_processes
from hydrali.core.process.preemption import Preempted
from hydrali.core.run.runner import run


def process_main(folder: Path) -> None:
    """One process of a job started by `run_processes`: the job's resolved config, context and logging (a log
    file per extra rank: <run dir>/<job name>_rank<N>.log) from `folder`, then the run."""
    rank = int(os.environ[TORCHRUN.rank])
    cfg = OmegaConf.load(folder / CONFIG_FILE)
    job_context.adopt(job_context.JobContext(**json.loads((folder / CONTEXT_FILE).read_text())))
    if (folder / LOGGING_FILE).exists():
        logging_cfg = json.loads((folder / LOGGING_FILE).read_text())
        file_handler = logging_cfg.get("handlers", {}).get("file")
        if rank > 0 and file_handler and "filename" in file_handler:
            name = Path(file_handler["filename"])
            file_handler["filename"] = str(name.with_name(f"{name.stem}_rank{rank}{name.suffix}"))
        logging.config.dictConfig(logging_cfg)
    try:
        run(cfg)
    except HydraliError as err:
        (folder / f"rank{rank}.error").write_text(f"{err}\n")
        print(f"hydrali: error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    except Preempted as stop:  # the job's process says it (hydrali.core.distributed.local_launch)
        sys.exit(EXIT_SIGNAL_BASE + stop.signum)
    except BaseException as err:
        text = str(err).strip().splitlines()
        (folder / f"rank{rank}.error").write_text(f"{type(err).__name__}: {text[0] if text else ''}\n")
        raise


if __name__ == "__main__":
    live_processes.stop_with_launcher()  # first: it never outlives the job's process
    with collector.command_process(paused_until_loaded=True):
        register_schemas()
        process_main(Path(sys.argv[1]))
