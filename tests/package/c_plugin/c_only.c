/* c_only: the smallest backend plugin in C99, for tests/package/c_plugin. It claims nothing, so
 * kiln runs every node eagerly; it loads, describes itself and is listed by `kiln plugins`. */
#include <stdlib.h>
#include <string.h>

#include <kiln/plugin_api.h>

struct KilnError {
  KilnErrorCode code;
  const char* message; /* static strings only */
};

static KilnErrorCode error_code(const KilnError* e) { return e->code; }
static const char* error_message(const KilnError* e) { return e->message; }
static void error_destroy(KilnError* e) { free(e); }

static KilnError* make_error(KilnErrorCode code, const char* message) {
  KilnError* e = (KilnError*)malloc(sizeof *e);
  e->code = code;
  e->message = message;
  return e;
}

static KilnError* claim(KilnPluginClaimArgs* args) {
  args->num_claimed = 0;
  return NULL;
}

static KilnError* compile(KilnPluginCompileArgs* args) {
  args->executable = NULL;
  return make_error(KILN_ERROR_UNIMPLEMENTED, "c_only compiles nothing");
}

static KilnError* execute(KilnExecutableExecuteArgs* args) {
  (void)args;
  return make_error(KILN_ERROR_INTERNAL, "c_only has no executables");
}

static void executable_destroy(KilnExecutableDestroyArgs* args) { (void)args; }

static const KilnPluginDescriptor descriptor = {KILN_PLUGIN_DESCRIPTOR_STRUCT_SIZE,
                                                "c_only",
                                                C_ONLY_VERSION,
                                                "kiln tests",
                                                "a C plugin built in a project without C++",
                                                KILN_DEVICE_MASK_CPU,
                                                KILN_MODE_BIT(KILN_MODE_DEFAULT),
                                                0,
                                                0,
                                                0};

static KilnPluginApi api;

KILN_PLUGIN_EXPORT KilnError* kiln_plugin_init(const KilnHostApi* host, uint32_t host_abi_major,
                                               uint32_t host_abi_minor, const KilnPluginApi** out) {
  (void)host;
  (void)host_abi_minor;
  memset(&api, 0, sizeof api);
  api.struct_size = KILN_PLUGIN_API_STRUCT_SIZE;
  api.abi_major = KILN_ABI_VERSION_MAJOR;
  api.abi_minor = KILN_ABI_VERSION_MINOR;
  api.error_code = error_code;
  api.error_message = error_message;
  api.error_destroy = error_destroy;
  *out = &api;
  if (host_abi_major != KILN_ABI_VERSION_MAJOR)
    return make_error(KILN_ERROR_ABI_MISMATCH, "c_only: built for another ABI major");
  api.plugin_ctx = &api;
  api.descriptor = &descriptor;
  api.claim = claim;
  api.compile = compile;
  api.execute = execute;
  api.executable_destroy = executable_destroy;
  return NULL;
}
