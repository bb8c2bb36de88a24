# Installs the SDK: the plugin API headers, the CMake package `kiln` (kiln::plugin_api and
# kiln_add_plugin), and the `kiln` tool.
install(TARGETS kiln_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/plugin_api/include/kiln DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
