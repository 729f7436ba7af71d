"""The compiled parts of zerosum; everything else is in pyproject.toml.

* ``noise._tag_sums`` computes the aggregate check's tags in one pass over
  the words (noise/_tag_sums.c, used by ``noise.aggregate_check.tags``);
* ``noise._keystream`` makes the keyed streams' raw words with the CPU's AES
  instructions, straight into (or added into) the caller's vector
  (noise/_keystream.c, used by ``noise.stream.uniform_uint64`` and
  ``add_uniform_uint64``).

Both are optional: where no C compiler is found the install goes on, and the
same results come from the numpy and OpenSSL paths.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "noise._tag_sums",
            sources=["noise/_tag_sums.c"],
            optional=True,
            extra_compile_args=["-O3"],
        ),
        Extension(
            "noise._keystream",
            sources=["noise/_keystream.c"],
            optional=True,
            extra_compile_args=["-O3"],
        ),
    ]
)
