"""The version of muster this client belongs to: the C library's (the
project() VERSION in CMakeLists.txt; the build checks that they agree)."""

__version__ = "0.2.0"
