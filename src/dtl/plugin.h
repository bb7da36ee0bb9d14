/* SPDX-License-Identifier: Apache-2.0 */
/* The entry point of a DTL transport plugin (libdyad_ofi.so), loaded by
 * src/dtl/registry.cpp with dlopen.
 *
 * A plugin exports one C function, DYAD_DTL_PLUGIN_ENTRY, returning a plain C
 * struct that outlives the process. libdyad checks abi_version, struct_size
 * and build_id before it calls anything else in the plugin: the backend the
 * plugin returns is a C++ object (dyad::dtl::Backend) that crosses the
 * boundary, so the plugin must have been built from the same DYAD, by a
 * compiler with the same C++ ABI, against the same Asio and JSON headers.
 * The plugin links DYAD's layers into itself (dyad::internal, privately) and
 * needs nothing of libdyad.so; the code that loads it (libdyad.so, dyadd,
 * the dyad tool, the wrapper: each has its own copy) gives it its log.
 *
 * Compatibility rule: a change to this struct's meaning bumps
 * DYAD_DTL_PLUGIN_ABI_VERSION and the entry point's name (_v2, ...); fields
 * are only ever appended (struct_size says how many the plugin has). */
#ifndef DYAD_DTL_PLUGIN_H
#define DYAD_DTL_PLUGIN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DYAD_DTL_PLUGIN_ABI_VERSION 1u
#define DYAD_DTL_PLUGIN_ENTRY "dyad_dtl_plugin_v1"

typedef struct dyad_dtl_plugin {
    uint32_t abi_version; /* DYAD_DTL_PLUGIN_ABI_VERSION of the plugin's build */
    uint32_t struct_size; /* sizeof(dyad_dtl_plugin_t) in the plugin's build */
    const char* build_id; /* DYAD_DTL_BUILD_ID of the plugin's build */
    const char* name;     /* the transport, e.g. "MARGO" */
    /* A dyad::dtl::Backend* owned by the plugin, never freed; called once,
     * and only after the checks above passed. */
    void* (*backend)(void);
    /* The plugin holds its own copy of the layers it uses (libdyad.so
     * exports DYAD's API only): the loader hands it its log (a
     * const dyad::log::Host*), before backend(), so that the plugin's lines
     * go where the loader's go, at its level. */
    void (*use_log)(const void* host);
} dyad_dtl_plugin_t;

typedef const dyad_dtl_plugin_t* (*dyad_dtl_plugin_entry_fn)(void);

/* The entry point a plugin defines (and exports alone). */
const dyad_dtl_plugin_t* dyad_dtl_plugin_v1(void);

#ifdef __cplusplus
}
#endif

#ifdef __cplusplus
/* What the plugin and libdyad must agree on, as one string literal: the DYAD
 * version, the compiler and its C++ ABI, the standard library's string ABI
 * and debug mode, the data model, the C++ standard, and the versions and
 * layout-changing options of the header-only libraries whose types cross the
 * boundary (Asio, nlohmann::json). Each side compiles it with its own values
 * (it is a macro, never a function one side could bind to the other's). The
 * plugin also embeds it after DYAD_DTL_BUILD_ID_MARKER, so a plugin that
 * cannot even be loaded can still be named by its build. */
#include <asio/version.hpp>
#include <cstddef>
#include <nlohmann/json_fwd.hpp>

#ifndef DYAD_VERSION_STRING
#error "DYAD_VERSION_STRING must be defined (the project's version) where plugin.h is used"
#endif
#ifndef _GLIBCXX_USE_CXX11_ABI
#define DYAD_DTL_CXX11_ABI_ 0
#else
#define DYAD_DTL_CXX11_ABI_ _GLIBCXX_USE_CXX11_ABI
#endif
#ifdef _GLIBCXX_DEBUG
#define DYAD_DTL_GLIBCXX_DEBUG_ " glibcxx-debug"
#else
#define DYAD_DTL_GLIBCXX_DEBUG_ ""
#endif
#ifdef ASIO_ENABLE_HANDLER_TRACKING
#define DYAD_DTL_ASIO_TRACKING_ " asio-handler-tracking"
#else
#define DYAD_DTL_ASIO_TRACKING_ ""
#endif
#ifdef ASIO_NO_DEPRECATED
#define DYAD_DTL_ASIO_DEPRECATED_ ""
#else
#define DYAD_DTL_ASIO_DEPRECATED_ " asio-deprecated"
#endif
#define DYAD_DTL_STR_(x) #x
#define DYAD_DTL_STR(x) DYAD_DTL_STR_(x)

#define DYAD_DTL_ID_COMPILER_ \
    "compiler " __VERSION__ " (C++ ABI " DYAD_DTL_STR(__GXX_ABI_VERSION) ")"
#define DYAD_DTL_ID_STDLIB_                                                                     \
    "libstdc++ " DYAD_DTL_STR(_GLIBCXX_RELEASE) " cxx11-abi " DYAD_DTL_STR(DYAD_DTL_CXX11_ABI_) \
        DYAD_DTL_GLIBCXX_DEBUG_
#define DYAD_DTL_ID_MODEL_                                 \
    "c++ " DYAD_DTL_STR(__cplusplus) " ptr " DYAD_DTL_STR( \
        __SIZEOF_POINTER__) " long " DYAD_DTL_STR(__SIZEOF_LONG__)
#define DYAD_DTL_ID_LIBS_                                                                \
    "asio " DYAD_DTL_STR(ASIO_VERSION) DYAD_DTL_ASIO_TRACKING_ DYAD_DTL_ASIO_DEPRECATED_ \
        " json " DYAD_DTL_STR(NLOHMANN_JSON_VERSION_MAJOR) "." DYAD_DTL_STR(             \
            NLOHMANN_JSON_VERSION_MINOR) "." DYAD_DTL_STR(NLOHMANN_JSON_VERSION_PATCH)
#define DYAD_DTL_BUILD_ID                                                           \
    "dyad " DYAD_VERSION_STRING "; " DYAD_DTL_ID_COMPILER_ "; " DYAD_DTL_ID_STDLIB_ \
    "; " DYAD_DTL_ID_MODEL_ "; " DYAD_DTL_ID_LIBS_

#define DYAD_DTL_BUILD_ID_MARKER "dyad-dtl-plugin-build-id="
#endif

#endif /* DYAD_DTL_PLUGIN_H */
