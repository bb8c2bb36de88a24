/* Compiles kiln/plugin_api.h as strict C99 (and, through abi_layout_test_cxx.cpp, as C++17) and
 * checks that every struct has the size and field offsets the ABI promises on LP64 targets
 * (docs/abi.md lists them). A change here is an ABI change: it needs a new major version, or, for a
 * field appended at the end, a new minor and a CHANGELOG entry. The offsets marked "every major"
 * are what lets any kiln read any plugin's version: they never move. */
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
#define SIZE(type, macro, expected)                   \
  check("sizeof(" #type ")", sizeof(type), expected); \
  check(#macro, macro, expected)

int main(void) {
  check("KILN_ABI_VERSION_MAJOR", KILN_ABI_VERSION_MAJOR, 2);
  check("KILN_ABI_VERSION_MINOR", KILN_ABI_VERSION_MINOR, 5);
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

  SIZE(KilnValue, KILN_VALUE_STRUCT_SIZE, 56);
  OFF(KilnValue, id, 8);
  OFF(KilnValue, dtype, 16);
  OFF(KilnValue, ndim, 20);
  OFF(KilnValue, device, 24);
  OFF(KilnValue, shape, 32);
  OFF(KilnValue, strides, 40);
  OFF(KilnValue, storage_offset, 48);

  SIZE(KilnArg, KILN_ARG_STRUCT_SIZE, 104);
  OFF(KilnArg, runtime_scalar, 96);
  OFF(KilnArg, reserved0, 100);
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

  SIZE(KilnGraphView, KILN_GRAPH_VIEW_STRUCT_SIZE, 104);
  OFF(KilnGraphView, num_values, 8);
  OFF(KilnGraphView, values, 16);
  OFF(KilnGraphView, num_nodes, 24);
  OFF(KilnGraphView, nodes, 32);
  OFF(KilnGraphView, num_inputs, 40);
  OFF(KilnGraphView, inputs, 48);
  OFF(KilnGraphView, num_outputs, 56);
  OFF(KilnGraphView, outputs, 64);
  OFF(KilnGraphView, num_symbols, 72);
  OFF(KilnGraphView, symbols, 80);
  OFF(KilnGraphView, num_size_sites, 88);
  OFF(KilnGraphView, size_sites, 96);

  SIZE(KilnPluginDescriptor, KILN_PLUGIN_DESCRIPTOR_STRUCT_SIZE, 64);
  OFF(KilnPluginDescriptor, name, 8);
  OFF(KilnPluginDescriptor, version, 16);
  OFF(KilnPluginDescriptor, vendor, 24);
  OFF(KilnPluginDescriptor, description, 32);
  OFF(KilnPluginDescriptor, device_kinds, 40);
  OFF(KilnPluginDescriptor, modes, 44);
  OFF(KilnPluginDescriptor, capabilities, 48);
  OFF(KilnPluginDescriptor, default_score, 56);
  OFF(KilnPluginDescriptor, reserved0, 60);

  SIZE(KilnOption, KILN_OPTION_STRUCT_SIZE, 24);
  OFF(KilnOption, key, 8);
  OFF(KilnOption, value, 16);

  /* ---- host functions' args ---- */
  SIZE(KilnHostLogArgs, KILN_HOST_LOG_ARGS_STRUCT_SIZE, 40);
  OFF(KilnHostLogArgs, host_ctx, 8);
  OFF(KilnHostLogArgs, level, 16);
  OFF(KilnHostLogArgs, plugin, 24);
  OFF(KilnHostLogArgs, message, 32);
  SIZE(KilnHostDeviceAllocArgs, KILN_HOST_DEVICE_ALLOC_ARGS_STRUCT_SIZE, 48);
  OFF(KilnHostDeviceAllocArgs, device, 16);
  OFF(KilnHostDeviceAllocArgs, nbytes, 24);
  OFF(KilnHostDeviceAllocArgs, stream, 32);
  OFF(KilnHostDeviceAllocArgs, ptr, 40);
  SIZE(KilnHostDeviceFreeArgs, KILN_HOST_DEVICE_FREE_ARGS_STRUCT_SIZE, 32);
  OFF(KilnHostDeviceFreeArgs, device, 16);
  OFF(KilnHostDeviceFreeArgs, ptr, 24);
  SIZE(KilnHostCacheDirArgs, KILN_HOST_CACHE_DIR_ARGS_STRUCT_SIZE, 24);
  OFF(KilnHostCacheDirArgs, cache_dir, 16);
  SIZE(KilnHostGetOptionArgs, KILN_HOST_GET_OPTION_ARGS_STRUCT_SIZE, 40);
  OFF(KilnHostGetOptionArgs, plugin, 16);
  OFF(KilnHostGetOptionArgs, key, 24);
  OFF(KilnHostGetOptionArgs, value, 32);
  SIZE(KilnHostCallEagerArgs, KILN_HOST_CALL_EAGER_ARGS_STRUCT_SIZE, 56);
  OFF(KilnHostCallEagerArgs, op, 16);
  OFF(KilnHostCallEagerArgs, args, 24);
  OFF(KilnHostCallEagerArgs, num_args, 32);
  OFF(KilnHostCallEagerArgs, outputs, 40);
  OFF(KilnHostCallEagerArgs, num_outputs, 48);

  SIZE(KilnHostApi, KILN_HOST_API_STRUCT_SIZE, 96);
  OFF(KilnHostApi, abi_major, 8);      /* every major */
  OFF(KilnHostApi, abi_minor, 12);     /* every major */
  OFF(KilnHostApi, error_code, 16);    /* every major */
  OFF(KilnHostApi, error_message, 24); /* every major */
  OFF(KilnHostApi, error_destroy, 32); /* every major */
  OFF(KilnHostApi, host_ctx, 40);
  OFF(KilnHostApi, log, 48);
  OFF(KilnHostApi, device_alloc, 56);
  OFF(KilnHostApi, device_free, 64);
  OFF(KilnHostApi, cache_dir, 72);
  OFF(KilnHostApi, get_option, 80);
  OFF(KilnHostApi, call_eager, 88);

  /* ---- plugin functions' args ---- */
  SIZE(KilnPluginAvailableArgs, KILN_PLUGIN_AVAILABLE_ARGS_STRUCT_SIZE, 56);
  OFF(KilnPluginAvailableArgs, plugin_ctx, 8);
  OFF(KilnPluginAvailableArgs, devices, 16);
  OFF(KilnPluginAvailableArgs, num_devices, 24);
  OFF(KilnPluginAvailableArgs, available, 32);
  OFF(KilnPluginAvailableArgs, score, 36);
  OFF(KilnPluginAvailableArgs, reason, 40);
  OFF(KilnPluginAvailableArgs, reason_capacity, 48);
  SIZE(KilnPluginClaimArgs, KILN_PLUGIN_CLAIM_ARGS_STRUCT_SIZE, 40);
  OFF(KilnPluginClaimArgs, graph, 16);
  OFF(KilnPluginClaimArgs, claimed_nodes, 24);
  OFF(KilnPluginClaimArgs, num_claimed, 32);
  SIZE(KilnPluginCompileArgs, KILN_PLUGIN_COMPILE_ARGS_STRUCT_SIZE, 88);
  OFF(KilnPluginCompileArgs, subgraph, 16);
  OFF(KilnPluginCompileArgs, mode, 24);
  OFF(KilnPluginCompileArgs, options, 32);
  OFF(KilnPluginCompileArgs, num_options, 40);
  OFF(KilnPluginCompileArgs, cache_dir, 48);
  OFF(KilnPluginCompileArgs, executable, 56);
  OFF(KilnPluginCompileArgs, inplace_inputs, 64);
  OFF(KilnPluginCompileArgs, inplace_accepted, 72);
  OFF(KilnPluginCompileArgs, symbolic_accepted, 80);
  OFF(KilnPluginCompileArgs, inplace_atomic, 84);
  SIZE(KilnPluginShutdownArgs, KILN_PLUGIN_SHUTDOWN_ARGS_STRUCT_SIZE, 16);
  SIZE(KilnExecutableExecuteArgs, KILN_EXECUTABLE_EXECUTE_ARGS_STRUCT_SIZE, 88);
  OFF(KilnExecutableExecuteArgs, executable, 8);
  OFF(KilnExecutableExecuteArgs, inputs, 16);
  OFF(KilnExecutableExecuteArgs, num_inputs, 24);
  OFF(KilnExecutableExecuteArgs, outputs, 32);
  OFF(KilnExecutableExecuteArgs, num_outputs, 40);
  OFF(KilnExecutableExecuteArgs, scalars, 48);
  OFF(KilnExecutableExecuteArgs, num_scalars, 56);
  OFF(KilnExecutableExecuteArgs, stream, 64);
  OFF(KilnExecutableExecuteArgs, symbol_values, 72);
  OFF(KilnExecutableExecuteArgs, num_symbol_values, 80);
  SIZE(KilnExecutableDestroyArgs, KILN_EXECUTABLE_DESTROY_ARGS_STRUCT_SIZE, 16);
  SIZE(KilnGraphCaptureBeginArgs, KILN_GRAPH_CAPTURE_BEGIN_ARGS_STRUCT_SIZE, 32);
  OFF(KilnGraphCaptureBeginArgs, device, 16);
  OFF(KilnGraphCaptureBeginArgs, stream, 24);
  SIZE(KilnGraphCaptureEndArgs, KILN_GRAPH_CAPTURE_END_ARGS_STRUCT_SIZE, 56);
  OFF(KilnGraphCaptureEndArgs, graph, 32);
  OFF(KilnGraphCaptureEndArgs, copies, 40);
  OFF(KilnGraphCaptureEndArgs, num_copies, 48);
  SIZE(KilnGraphLaunchArgs, KILN_GRAPH_LAUNCH_ARGS_STRUCT_SIZE, 40);
  OFF(KilnGraphLaunchArgs, stream, 16);
  OFF(KilnGraphLaunchArgs, copies, 24);
  OFF(KilnGraphLaunchArgs, num_copies, 32);
  check("sizeof(KilnGraphCopy)", sizeof(KilnGraphCopy), 24);
  check("offsetof(KilnGraphCopy, src)", offsetof(KilnGraphCopy, src), 8);
  check("offsetof(KilnGraphCopy, bytes)", offsetof(KilnGraphCopy, bytes), 16);
  check("sizeof(KilnSizeSymbol)", sizeof(KilnSizeSymbol), 8);
  check("offsetof(KilnSizeSymbol, dim)", offsetof(KilnSizeSymbol, dim), 4);
  check("sizeof(KilnSizeSite)", sizeof(KilnSizeSite), 56);
  check("offsetof(KilnSizeSite, factors)", offsetof(KilnSizeSite, factors), 20);
  check("offsetof(KilnSizeSite, reciprocal)", offsetof(KilnSizeSite, reciprocal), 28);
  check("offsetof(KilnSizeSite, num)", offsetof(KilnSizeSite, num), 32);
  check("offsetof(KilnSizeSite, constant)", offsetof(KilnSizeSite, constant), 48);
  check("KILN_CAPABILITY_GRAPH_COPIES", KILN_CAPABILITY_GRAPH_COPIES, 32);
  SIZE(KilnGraphDestroyArgs, KILN_GRAPH_DESTROY_ARGS_STRUCT_SIZE, 16);

  SIZE(KilnPluginApi, KILN_PLUGIN_API_STRUCT_SIZE, 136);
  OFF(KilnPluginApi, abi_major, 8);      /* every major */
  OFF(KilnPluginApi, abi_minor, 12);     /* every major */
  OFF(KilnPluginApi, error_code, 16);    /* every major */
  OFF(KilnPluginApi, error_message, 24); /* every major */
  OFF(KilnPluginApi, error_destroy, 32); /* every major */
  check("KILN_PLUGIN_API_HEADER_SIZE", KILN_PLUGIN_API_HEADER_SIZE, 40);
  OFF(KilnPluginApi, plugin_ctx, 40);
  OFF(KilnPluginApi, descriptor, 48);
  OFF(KilnPluginApi, available, 56);
  OFF(KilnPluginApi, claim, 64);
  OFF(KilnPluginApi, compile, 72);
  OFF(KilnPluginApi, shutdown, 80);
  OFF(KilnPluginApi, execute, 88);
  OFF(KilnPluginApi, executable_destroy, 96);
  OFF(KilnPluginApi, graph_capture_begin, 104);
  OFF(KilnPluginApi, graph_capture_end, 112);
  OFF(KilnPluginApi, graph_launch, 120);
  OFF(KilnPluginApi, graph_destroy, 128);

  {
    /* KILN_HAS_FIELD: a reader sees every field of a full table, none past a short one. */
    KilnPluginApi api;
    api.struct_size = KILN_PLUGIN_API_STRUCT_SIZE;
    check("KILN_HAS_FIELD(full, graph_destroy)", KILN_HAS_FIELD(&api, KilnPluginApi, graph_destroy), 1);
    api.struct_size = offsetof(KilnPluginApi, graph_capture_begin);
    check("KILN_HAS_FIELD(short table, executable_destroy)", KILN_HAS_FIELD(&api, KilnPluginApi, executable_destroy),
          1);
    check("KILN_HAS_FIELD(short table, graph_capture_begin)", KILN_HAS_FIELD(&api, KilnPluginApi, graph_capture_begin),
          0);
    api.struct_size = KILN_PLUGIN_API_HEADER_SIZE;
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
