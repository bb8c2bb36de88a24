/* Compiles kiln/plugin_api.h as strict C99 (and, through abi_layout_test_cxx.cpp, as C++17) and
 * checks that every struct has the size and field offsets the ABI promises on LP64 targets
 * (docs/abi.md lists them). A change here is an ABI change: it needs a new major version, or, for a
 * field appended at the end, a new minor and a CHANGELOG entry. */
#include <stddef.h>
#include <stdio.h>

#include <kiln/plugin_api.h>

static int failures = 0;

static void check(const char* what, size_t actual, size_t expected) {
  if (actual != expected) {
    printf("FAIL %s: %lu, expected %lu\n", what, (unsigned long)actual, (unsigned long)expected);
    ++failures;
  }
}

#define OFF(type, field, expected) check(#type "." #field, offsetof(type, field), expected)
#define SIZE(type, macro, expected)          \
  check("sizeof(" #type ")", sizeof(type), expected); \
  check(#macro, macro, expected)

int main(void) {
  check("KILN_ABI_VERSION_MAJOR", KILN_ABI_VERSION_MAJOR, 1);
  check("KILN_ABI_VERSION_MINOR", KILN_ABI_VERSION_MINOR, 2);
  check("sizeof(DLTensor)", sizeof(DLTensor), 48);
  check("sizeof(DLDataType)", sizeof(DLDataType), 4);
  check("sizeof(DLDevice)", sizeof(DLDevice), 8);

  SIZE(KilnDeviceInfo, KILN_DEVICE_INFO_STRUCT_SIZE, 80);
  OFF(KilnDeviceInfo, kind, 8);
  OFF(KilnDeviceInfo, index, 12);
  OFF(KilnDeviceInfo, name, 16);
  OFF(KilnDeviceInfo, vendor, 24);
  OFF(KilnDeviceInfo, pci_bus_id, 32);
  OFF(KilnDeviceInfo, pci_vendor_id, 40);
  OFF(KilnDeviceInfo, pci_device_id, 44);
  OFF(KilnDeviceInfo, compute_capability_major, 48);
  OFF(KilnDeviceInfo, compute_capability_minor, 52);
  OFF(KilnDeviceInfo, total_memory_bytes, 56);
  OFF(KilnDeviceInfo, multiprocessor_count, 64);
  OFF(KilnDeviceInfo, cpu_isa, 72);

  SIZE(KilnAvailability, KILN_AVAILABILITY_STRUCT_SIZE, 32);
  OFF(KilnAvailability, available, 8);
  OFF(KilnAvailability, score, 12);
  OFF(KilnAvailability, reason, 16);
  OFF(KilnAvailability, reason_capacity, 24);

  SIZE(KilnValue, KILN_VALUE_STRUCT_SIZE, 56);
  OFF(KilnValue, id, 8);
  OFF(KilnValue, dtype, 16);
  OFF(KilnValue, ndim, 20);
  OFF(KilnValue, device, 24);
  OFF(KilnValue, shape, 32);
  OFF(KilnValue, strides, 40);
  OFF(KilnValue, storage_offset, 48);

  /* 1.1 appended runtime_scalar: the struct's data ends at 100, padded to 104. */
  check("sizeof(KilnArg)", sizeof(KilnArg), 104);
  check("KILN_ARG_STRUCT_SIZE", KILN_ARG_STRUCT_SIZE, 100);
  OFF(KilnArg, runtime_scalar, 96);
  OFF(KilnArg, tag, 8);
  OFF(KilnArg, dtype, 12);
  OFF(KilnArg, name, 16);
  OFF(KilnArg, i, 24);
  OFF(KilnArg, d, 32);
  OFF(KilnArg, s, 40);
  OFF(KilnArg, len, 48);
  OFF(KilnArg, ints, 56);
  OFF(KilnArg, doubles, 64);
  OFF(KilnArg, device, 72);
  OFF(KilnArg, tensor, 80);
  OFF(KilnArg, tensors, 88);

  SIZE(KilnNode, KILN_NODE_STRUCT_SIZE, 88);
  OFF(KilnNode, id, 8);
  OFF(KilnNode, op, 16);
  OFF(KilnNode, name, 24);
  OFF(KilnNode, overload, 32);
  OFF(KilnNode, num_args, 40);
  OFF(KilnNode, args, 48);
  OFF(KilnNode, num_inputs, 56);
  OFF(KilnNode, inputs, 64);
  OFF(KilnNode, num_outputs, 72);
  OFF(KilnNode, outputs, 80);

  SIZE(KilnGraphView, KILN_GRAPH_VIEW_STRUCT_SIZE, 72);
  OFF(KilnGraphView, num_values, 8);
  OFF(KilnGraphView, values, 16);
  OFF(KilnGraphView, num_nodes, 24);
  OFF(KilnGraphView, nodes, 32);
  OFF(KilnGraphView, num_inputs, 40);
  OFF(KilnGraphView, inputs, 48);
  OFF(KilnGraphView, num_outputs, 56);
  OFF(KilnGraphView, outputs, 64);

  SIZE(KilnPluginDescriptor, KILN_PLUGIN_DESCRIPTOR_STRUCT_SIZE, 56);
  OFF(KilnPluginDescriptor, name, 8);
  OFF(KilnPluginDescriptor, version, 16);
  OFF(KilnPluginDescriptor, vendor, 24);
  OFF(KilnPluginDescriptor, description, 32);
  OFF(KilnPluginDescriptor, device_kinds, 40);
  OFF(KilnPluginDescriptor, modes, 44);
  OFF(KilnPluginDescriptor, concurrent_execution_safe, 48);

  SIZE(KilnOption, KILN_OPTION_STRUCT_SIZE, 24);
  OFF(KilnOption, key, 8);
  OFF(KilnOption, value, 16);

  SIZE(KilnCompileOptions, KILN_COMPILE_OPTIONS_STRUCT_SIZE, 40);
  OFF(KilnCompileOptions, mode, 8);
  OFF(KilnCompileOptions, num_options, 16);
  OFF(KilnCompileOptions, options, 24);
  OFF(KilnCompileOptions, cache_dir, 32);

  SIZE(KilnHostApi, KILN_HOST_API_STRUCT_SIZE, 96);
  OFF(KilnHostApi, abi_major, 8);
  OFF(KilnHostApi, abi_minor, 12);
  OFF(KilnHostApi, error_code, 16);
  OFF(KilnHostApi, error_message, 24);
  OFF(KilnHostApi, error_destroy, 32);
  OFF(KilnHostApi, host_ctx, 40);
  OFF(KilnHostApi, log, 48);
  OFF(KilnHostApi, device_alloc, 56);
  OFF(KilnHostApi, device_free, 64);
  OFF(KilnHostApi, cache_dir, 72);
  OFF(KilnHostApi, get_option, 80);
  OFF(KilnHostApi, call_eager, 88);

  SIZE(KilnPluginApi, KILN_PLUGIN_API_STRUCT_SIZE, 144);
  /* The frozen header, the same in every major version. */
  OFF(KilnPluginApi, abi_major, 8);
  OFF(KilnPluginApi, abi_minor, 12);
  OFF(KilnPluginApi, error_code, 16);
  OFF(KilnPluginApi, error_message, 24);
  OFF(KilnPluginApi, error_destroy, 32);
  OFF(KilnPluginApi, plugin_ctx, 40);
  OFF(KilnPluginApi, descriptor, 48);
  OFF(KilnPluginApi, available, 56);
  OFF(KilnPluginApi, claim, 64);
  OFF(KilnPluginApi, compile, 72);
  OFF(KilnPluginApi, execute, 80);
  OFF(KilnPluginApi, executable_destroy, 88);
  OFF(KilnPluginApi, shutdown, 96);
  OFF(KilnPluginApi, execute_with_scalars, 104); /* 1.1 */
  OFF(KilnPluginApi, graph_capture_begin, 112); /* 1.2 */
  OFF(KilnPluginApi, graph_capture_end, 120);
  OFF(KilnPluginApi, graph_launch, 128);
  OFF(KilnPluginApi, graph_destroy, 136);

  {
    /* KILN_HAS_FIELD: a 1.0 reader sees every field of a full table, none past a short one. */
    KilnPluginApi api;
    api.struct_size = KILN_PLUGIN_API_STRUCT_SIZE;
    check("KILN_HAS_FIELD(full, shutdown)", KILN_HAS_FIELD(&api, KilnPluginApi, shutdown), 1);
    api.struct_size = offsetof(KilnPluginApi, execute_with_scalars); /* a 1.0 plugin's table */
    check("KILN_HAS_FIELD(1.0 table, shutdown)", KILN_HAS_FIELD(&api, KilnPluginApi, shutdown), 1);
    check("KILN_HAS_FIELD(1.0 table, execute_with_scalars)",
          KILN_HAS_FIELD(&api, KilnPluginApi, execute_with_scalars), 0);
    api.struct_size = offsetof(KilnPluginApi, graph_capture_begin); /* a 1.1 plugin's table */
    check("KILN_HAS_FIELD(1.1 table, execute_with_scalars)",
          KILN_HAS_FIELD(&api, KilnPluginApi, execute_with_scalars), 1);
    check("KILN_HAS_FIELD(1.1 table, graph_capture_begin)",
          KILN_HAS_FIELD(&api, KilnPluginApi, graph_capture_begin), 0);
    check("KILN_HAS_FIELD(1.1 table, graph_destroy)", KILN_HAS_FIELD(&api, KilnPluginApi, graph_destroy), 0);
    api.struct_size = offsetof(KilnPluginApi, plugin_ctx);
    check("KILN_HAS_FIELD(header only, error_destroy)", KILN_HAS_FIELD(&api, KilnPluginApi, error_destroy), 1);
    check("KILN_HAS_FIELD(header only, plugin_ctx)", KILN_HAS_FIELD(&api, KilnPluginApi, plugin_ctx), 0);
  }

  if (failures) {
    printf("%d layout check(s) failed\n", failures);
    return 1;
  }
  printf("all layout checks passed\n");
  return 0;
}
