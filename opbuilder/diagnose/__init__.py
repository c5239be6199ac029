"""Diagnosis: ``python -m opbuilder doctor`` checks that everything a build needs is here (compilers, ninja, the cache, prebuilt stores, CUDA and CuPy) and says what to do when it is not."""
