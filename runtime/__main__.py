"""`python -m jetson_unet`: what the package offers."""
from __future__ import annotations

import sys

from jetson_unet import __version__

OFFERS = f"""jetson_unet {__version__}: a torch-free diffusion U-Net inference runtime for NVIDIA Jetson

commands (each with --help and --version):
  jetson-sample    generate images as a PNG grid; --prepare builds the kernels ahead of time,
                   --plan-only prints the memory plan (neither needs a GPU)
  jetson-weights   make random weights for any config, or validate and describe a weights file
  jetson-bench     latency, images/s, power and energy per configuration, and cold starts
  jetson-tune      measure the tiles of every conv on this GPU into a tuning file
  jetson-serve     the model behind Triton Inference Server, batched (the serve extra)

Python API:
  from jetson_unet import Pipeline
  with Pipeline() as pipe:                        # the shipped model; backend and precision auto
      images = pipe.sample(batch=4, seed=0)       # (4, 64, 64, 3) uint8

The package's notices go to the logger "jetson_unet". Documentation: README.md and docs/ in the
source repository (docs/architecture.md walks one image from the CLI to a kernel launch).
"""


def main() -> int:
    print(OFFERS, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
