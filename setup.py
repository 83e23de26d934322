"""Build hook for kinspect's two optional C extensions: the fast path of the decoder
(kinspect/codec/_native.c) and the proxy's frame buffers (kinspect/proxy/_frames.c).

Everything else is in pyproject.toml. ``optional=True``: where no C compiler is
available the build goes on; kinspect then uses its generated Python decoder alone
(the test suite fails loudly in that case unless KINSPECT_NATIVE=0 says it is meant)
and reads large frames into bytearrays, copied once more.
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("kinspect.codec._native", ["kinspect/codec/_native.c"],
              optional=True, extra_compile_args=["-O2", "-Wall"]),
    Extension("kinspect.proxy._frames", ["kinspect/proxy/_frames.c"],
              optional=True, extra_compile_args=["-O2", "-Wall"]),
])
