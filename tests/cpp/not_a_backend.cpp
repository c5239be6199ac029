// A plain shared library with no opbuilder_backend_init: register_custom_backend must refuse it.
#include <cstdint>
extern "C" int64_t NotABackend(int64_t x) { return x + 1; }
