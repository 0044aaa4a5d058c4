"""The in-tree PEP 517 build backend: setuptools', plus the CUDA compiler wheels as build
requirements when this machine has no CUDA toolkit but wants the CUDA kernels (an NVIDIA GPU,
or FLASH_ATTN_DET_CUDA=1). Everything else is setuptools.build_meta unchanged; the decision
lives in fad_toolchain.py, which setup.py reads too."""
from setuptools import build_meta as _orig
from setuptools.build_meta import *  # noqa: F401,F403  (the PEP 517 hooks)

import fad_toolchain


def _extra():
    return fad_toolchain.cuda_wheel_requirements() if fad_toolchain.wants_cuda_wheels() else []


def get_requires_for_build_wheel(config_settings=None):
    return _orig.get_requires_for_build_wheel(config_settings) + _extra()


def get_requires_for_build_editable(config_settings=None):
    return _orig.get_requires_for_build_editable(config_settings) + _extra()
