# A Debian package of the install prefix, both components: `cpack -G DEB` in the build folder (or
# `cmake --build build --target package`) writes kiln_<version>_<arch>.deb, which installs under
# /usr: the `kiln` command and `kiln_conformance`, libkiln with its public headers, the in-tree
# backends in /usr/lib/kiln/plugins (where the loader looks, relative to the command and to
# libkiln), and the CMake package (find_package(kiln): kiln::kiln and the plugin SDK).
#
# LibTorch is not a Debian package. libkiln finds it where it was built against, through its run
# path: the torch wheel in the Python environment scripts/setup makes (/opt/kiln/venv, or
# KILN_VENV), which the package's description names instead of a dependency. The Debian libraries
# the binaries load are its dependencies.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME kiln)
set(CPACK_PACKAGE_VENDOR kiln)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "torch.compile for training, for C++ programs written against LibTorch")
string(CONCAT CPACK_PACKAGE_DESCRIPTION
    "kiln captures a whole LibTorch training step (forward, loss, backward, optimizer update) as one graph "
    "and hands it to a backend plugin that compiles it into fused kernels. Needs LibTorch from PyPI's "
    "torch==${Torch_VERSION} wheel at ${TORCH_INSTALL_PREFIX}/lib (what kiln was built against; "
    "scripts/setup in the kiln sources installs it).")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "kiln developers")
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libc6, libstdc++6, libgcc-s1, libspdlog1.10, libfmt9, libtomlplusplus3")
include(CPack)
