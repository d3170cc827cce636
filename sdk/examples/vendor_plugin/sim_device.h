/*
 * sim_device.h — what the two halves of the sim plugin share: the device (sim_device.c, C) and its kernels
 * (sim_kernels.cc, C++ over <keel/kernel.hpp>).
 */
#ifndef SIM_DEVICE_H_
#define SIM_DEVICE_H_

#include <keel/plugin.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when [p, p + bytes) lies inside the sim arena. Thread-safe (the arena does not move while the plugin is loaded). */
int sim_owns(const void* p, uint64_t bytes);

/* Registers the kernels Relu, Add and MatMul (f32) on "sim"; called from init. */
keel_status_t sim_register_kernels(const keel_core_api_t* host, keel_plugin_handle_t* plugin);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SIM_DEVICE_H_ */
