# SPDX-License-Identifier: Apache-2.0
"""pydyad's version: the DYAD project's (CMakeLists.txt, project(dyad_cpp
VERSION ...)); the build backend refuses to build a wheel when they differ."""
__version__ = "0.1.0"
