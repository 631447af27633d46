# Sourced on the GPU machine after ../shared/device/stage-wheels (../shared/device/README.md): the staged packages
# and the checkout as `hydrali` on PYTHONPATH, and in TF_LIBS the library path TensorFlow needs (the image's cuDNN
# 9.19 first, then the staged CUDA 12 libraries and NCCL), for bench.keras_library_path. The staged NCCL (CUDA 12)
# is moved out of /tmp/site, where the image's torch (CUDA 13) would fail to import beside it.
# the image's cuDNN, found before /tmp/site (whose nvidia/ package would hide the image's nvidia.cudnn)
C13=$(PYTHONPATH= python3 -c "import nvidia.cudnn; print(list(nvidia.cudnn.__path__)[0])")/lib
export PYTHONPATH=/tmp/site:/tmp/shim
mkdir -p /tmp/shim/hydrali && for d in core backends tasks conf bench; do ln -sfn "$PWD/$d" /tmp/shim/hydrali/$d; done
# hydra/launcher=hydrali, the default of -m: Hydra takes launchers from its hydra_plugins namespace only
mkdir -p /tmp/shim/hydra_plugins && ln -sfn "$PWD/hydra_plugins/hydrali_launcher" /tmp/shim/hydra_plugins/hydrali_launcher
if [ -d /tmp/site/nvidia/nccl ]; then mv /tmp/site/nvidia/nccl /tmp/nccl-cu12; fi
if [ -d /tmp/site/tensorflow ]; then
  TF_LIBS=$C13:$(ls -d /tmp/site/nvidia/*/lib | tr '\n' :)/tmp/nccl-cu12/lib
  export TF_LIBS PATH=/tmp/site/nvidia/cuda_nvcc/bin:$PATH XLA_FLAGS=--xla_gpu_cuda_data_dir=/tmp/site/nvidia/cuda_nvcc
fi
export PYTHONUNBUFFERED=1
