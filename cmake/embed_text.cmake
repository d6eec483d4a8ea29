# cmake -DIN=<file> -DOUT=<header> -P embed_text.cmake: writes a header defining the file's bytes as
# `inline constexpr std::string_view kEmbeddedText` inside namespace nextn::serve::web (hex bytes, so any
# content survives).
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "'\\\\x\\1'," body "${hex}")
file(WRITE "${OUT}.tmp" "// Generated from ${IN} by cmake/embed_text.cmake; do not edit.\n#pragma once\n#include <string_view>\nnamespace nextn::serve::web {\ninline constexpr char kPageBytes[] = {${body} 0};\ninline constexpr std::string_view kPage(kPageBytes, sizeof(kPageBytes) - 1);\n}  // namespace nextn::serve::web\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
