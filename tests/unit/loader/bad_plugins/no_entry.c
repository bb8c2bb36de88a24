/* A shared library that is not a kiln plugin: it exports a function, but not kiln_plugin_init. */
__attribute__((visibility("default"))) int not_a_kiln_plugin(void) { return 42; }
