/* A plugin as the kiln 1.2 SDK built it, in plain C99: the 1.2 function table and descriptor,
 * written out here because today's header no longer has them. It ignores the host's version and
 * returns its table, as a 1.x plugin written without the C++ layer may; the loader must refuse it
 * by the version in the table's frozen first fields, name it from the 1.x descriptor, and end the
 * context it made. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct KilnError KilnError;
struct KilnError {
  int32_t code;
};

/* The 1.2 descriptor and table, field for field. */
typedef struct {
  size_t struct_size;
  const char* name;
  const char* version;
  const char* vendor;
  const char* description;
  uint32_t device_kinds;
  uint32_t modes;
  uint32_t concurrent_execution_safe;
  uint32_t reserved0;
} DescriptorV1;

typedef struct {
  size_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  int32_t (*error_code)(const KilnError* error);
  const char* (*error_message)(const KilnError* error);
  void (*error_destroy)(KilnError* error);
  void* plugin_ctx;
  const DescriptorV1* descriptor;
  void* available;
  void* claim;
  void* compile;
  void* execute;
  void* executable_destroy;
  void (*shutdown)(void* plugin_ctx);
  void* execute_with_scalars;
  void* graph_capture_begin;
  void* graph_capture_end;
  void* graph_launch;
  void* graph_destroy;
} PluginApiV1_2;

static int32_t err_code(const KilnError* e) { return e->code; }
static const char* err_message(const KilnError* e) {
  (void)e;
  return "unused";
}
static void err_destroy(KilnError* e) { free(e); }
static void shutdown_ctx(void* ctx) { (void)ctx; }

static const DescriptorV1 g_descriptor = {
    sizeof(DescriptorV1), "old_abi", "1.0.0", "kiln tests", "a plugin built for kiln plugin ABI 1.2", 1u, 1u, 0u, 0u};
static PluginApiV1_2 g_api;

__attribute__((visibility("default"))) KilnError* kiln_plugin_init(const void* host, uint32_t host_abi_major,
                                                                   uint32_t host_abi_minor, const PluginApiV1_2** out) {
  (void)host;
  (void)host_abi_major;
  (void)host_abi_minor;
  g_api.struct_size = sizeof g_api;
  g_api.abi_major = 1;
  g_api.abi_minor = 2;
  g_api.error_code = err_code;
  g_api.error_message = err_message;
  g_api.error_destroy = err_destroy;
  g_api.plugin_ctx = &g_api;
  g_api.descriptor = &g_descriptor;
  g_api.shutdown = shutdown_ctx;
  *out = &g_api;
  return NULL;
}
