"""Object detection: single-stage (SSD-style) detectors trained from DALI's COCO reader, scored with COCO mAP."""
