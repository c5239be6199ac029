"""What the JAX tests share: 64-bit arrays for the module (float64 gradients against central differences).

A test module imports ``x64`` after its ``pytest.importorskip("jax")``; pytest then uses the fixture there."""
import pytest


@pytest.fixture(scope="module", autouse=True)
def x64():
    """jax_enable_x64 on for the module's tests, restored after."""
    import jax
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", old)
