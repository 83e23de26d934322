"""Build hook: kinspect's packages and its two optional C extensions.

Packages: ``kinspect`` and its subpackages, and the project's own spec files
(``specs/``: the KIP-714 telemetry APIs, which kafka-python's spec set lacks) as
``kinspect/_specs``, so that a kinspect installed from a wheel finds them too, not
only a checkout (see ``kinspect.codec.registry.PROJECT_SPECS``).

C extensions: the fast path of the decoder (kinspect/codec/_native.c) and the
proxy's frame buffers (kinspect/proxy/_frames.c). ``optional=True``: where no C
compiler is available the build goes on; kinspect then uses its generated Python
decoder alone (the test suite fails loudly in that case unless KINSPECT_NATIVE=0
says it is meant) and reads large frames into bytearrays, copied once more.

Everything else is in pyproject.toml.
"""

from setuptools import Extension, find_packages, setup

setup(
    packages=find_packages(include=["kinspect", "kinspect.*"]) + ["kinspect._specs"],
    package_dir={"kinspect._specs": "specs"},
    package_data={"kinspect._specs": ["*.json"]},
    ext_modules=[
        Extension("kinspect.codec._native", ["kinspect/codec/_native.c"],
                  optional=True, extra_compile_args=["-O2", "-Wall"]),
        Extension("kinspect.proxy._frames", ["kinspect/proxy/_frames.c"],
                  optional=True, extra_compile_args=["-O2", "-Wall"]),
    ],
)
