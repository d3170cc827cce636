// keel/core/runtime/reference_device.h — the built-in reference CPU device: a plugin like any other (same
// descriptor, same init, same tables), only linked into the core. It provides the "cpu" device type (host memory)
// and the portable reference kernels of ops/ at priority 0, so every other CPU plugin outranks it.
#pragma once

#include <keel/plugin.h>

namespace keel {
const keel_plugin_t* reference_plugin();
}
