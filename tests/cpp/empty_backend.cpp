// Includes the plugin header but registers no backend: register_custom_backend must refuse it.
#include "opbuilder/backend.h"
