# The include rule of src/ (docs/architecture.md, "Layers"): every folder of src/ is a layer, and a layer's
# code includes only its own headers and those of the layers below it:
#
#   core <- io <- ops <- memory <- models <- engine <- serve <- cli
#
# Inside models, src/models/common (what every family's loader and model share) never includes a family
# (src/models/<family>/), and no family includes another; files directly in src/models (the Model interface,
# the registry) may include both.
#
# Checked on every non-test source (src/**/*.h and *.cpp, not *_test.cpp): each `#include "<dir>/..."` whose
# <dir> is a folder of src/. An include of a folder of src/ that is not a layer, or a source in such a folder,
# is an error too: a new layer is added to NEXTN_LAYERS (and to CMakeLists.txt) first.
#
# Used three ways:
#   include(cmake/check_layers.cmake) + nextn_check_layers(<src>)   at configure time (CMakeLists.txt)
#   cmake -DNEXTN_LAYER_SRC=<src> [-DNEXTN_LAYER_STAMP=<file>] -P cmake/check_layers.cmake
#                                                                   as a build step (touches the stamp when
#                                                                   the tree is clean) and as a ctest test
# A violation fails with one line per forbidden include: "src/<file>:<line>: ..." naming the edge.

cmake_policy(VERSION 3.22)  # in `cmake -P` too (while(TRUE), empty list elements)

set(NEXTN_LAYERS core io ops memory models engine serve cli)  # bottom to top

# The layer order as the messages show it: "core <- io <- ... <- cli".
function(nextn_layer_order_text out)
  string(REPLACE ";" " <- " text "${NEXTN_LAYERS}")
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

# The quoted includes of `file` as a list of "<line>|<path>".
function(nextn_quoted_includes file out)
  file(READ "${file}" text)
  set(found "")
  set(line 1)
  while(TRUE)
    # An include directive at the start of a line (the text's start is a line start: the previous match
    # ended at its closing quote, and nothing follows an include on its line).
    string(REGEX MATCH "(^|\n)[ \t]*#[ \t]*include[ \t]*\"[^\"\n]*\"" directive "${text}")
    if(directive STREQUAL "")
      break()
    endif()
    string(FIND "${text}" "${directive}" at)
    string(LENGTH "${directive}" length)
    math(EXPR end "${at} + ${length}")
    string(SUBSTRING "${text}" 0 ${end} through)
    string(REGEX MATCHALL "\n" newlines "${through}")
    list(LENGTH newlines count)
    math(EXPR line "${line} + ${count}")
    string(REGEX REPLACE ".*\"([^\"]*)\"$" "\\1" path "${directive}")
    list(APPEND found "${line}|${path}")
    string(SUBSTRING "${text}" ${end} -1 text)
  endwhile()
  set(${out} "${found}" PARENT_SCOPE)
endfunction()

# The part of src/models a models path ("models/<x>/...") lies in: "common", a family's name, or "" for the
# files directly in src/models.
function(nextn_models_part path out)
  string(REPLACE "/" ";" parts "${path}")
  list(LENGTH parts n)
  set(part "")
  if(n GREATER 2)
    list(GET parts 1 part)
  endif()
  set(${out} "${part}" PARENT_SCOPE)
endfunction()

# The rule an include of `to` (a path under src/, e.g. "engine/sampler.h") from `from` (a source under src/)
# breaks, as a sentence; "" when the include is allowed.
function(nextn_forbidden_edge from to out)
  set(why "")
  string(REGEX MATCH "^[^/]+" from_layer "${from}")
  string(REGEX MATCH "^[^/]+" to_layer "${to}")
  list(FIND NEXTN_LAYERS "${from_layer}" from_rank)
  list(FIND NEXTN_LAYERS "${to_layer}" to_rank)
  nextn_layer_order_text(order)
  if(to_rank LESS 0)
    set(why "src/${to_layer}/ is not a layer (layers: ${order}); add it to NEXTN_LAYERS in cmake/check_layers.cmake")
  elseif(to_rank GREATER from_rank)
    set(why "layer ${from_layer} must not include layer ${to_layer} (${from_layer} -> ${to_layer}): a layer includes only itself and the layers below it, ${order}")
  elseif(from_layer STREQUAL "models" AND to_layer STREQUAL "models")
    nextn_models_part("${from}" from_part)
    nextn_models_part("${to}" to_part)
    if(NOT to_part STREQUAL "" AND NOT to_part STREQUAL "common" AND NOT to_part STREQUAL from_part)
      if(from_part STREQUAL "common")
        set(why "src/models/common must not include a model family (common -> ${to_part}): shared code knows no family")
      elseif(NOT from_part STREQUAL "")
        set(why "model family ${from_part} must not include family ${to_part} (${from_part} -> ${to_part}): code both need goes in src/models/common")
      endif()
    endif()
  endif()
  set(${out} "${why}" PARENT_SCOPE)
endfunction()

# Every violation in `src` as "src/<file>:<line>: <problem>" lines in `out`.
function(nextn_layer_violations src out)
  file(GLOB_RECURSE sources RELATIVE "${src}" "${src}/*.h" "${src}/*.cpp")
  list(FILTER sources EXCLUDE REGEX "_test\\.cpp$")
  list(SORT sources)
  nextn_layer_order_text(order)
  set(problems "")
  foreach(file IN LISTS sources)
    string(REGEX MATCH "^[^/]+" layer "${file}")
    list(FIND NEXTN_LAYERS "${layer}" rank)
    if(rank LESS 0 OR NOT file MATCHES "/")
      list(APPEND problems "src/${file}: not in a layer (layers: ${order}): move it into one, or add its folder to NEXTN_LAYERS in cmake/check_layers.cmake")
      continue()
    endif()
    get_filename_component(dir "${src}/${file}" DIRECTORY)
    nextn_quoted_includes("${src}/${file}" includes)
    foreach(entry IN LISTS includes)
      string(REGEX REPLACE "^([0-9]+)\\|.*" "\\1" line "${entry}")
      string(REGEX REPLACE "^[0-9]+\\|" "" path "${entry}")
      # A relative path ("../x/y.h", "./y.h") is found next to the including file first: check where it lands.
      set(target "${path}")
      if(path MATCHES "^\\.\\.?/" OR path MATCHES "/\\.\\./")
        get_filename_component(resolved "${dir}/${path}" ABSOLUTE)
        file(RELATIVE_PATH target "${src}" "${resolved}")
        if(target MATCHES "^\\.\\./")
          continue()  # outside src/
        endif()
      endif()
      # Same-folder includes ("x.h") and folders that are neither layers nor in src/ ("hwy/highway.h") are
      # not layer edges.
      string(REGEX MATCH "^[^/]+" first "${target}")
      list(FIND NEXTN_LAYERS "${first}" first_rank)
      if(NOT target MATCHES "/" OR (first_rank LESS 0 AND NOT IS_DIRECTORY "${src}/${first}"))
        continue()
      endif()
      nextn_forbidden_edge("${file}" "${target}" why)
      if(NOT why STREQUAL "")
        list(APPEND problems "src/${file}:${line}: #include \"${path}\": ${why}")
      endif()
    endforeach()
  endforeach()
  set(${out} "${problems}" PARENT_SCOPE)
endfunction()

# Fails unless every include in `src` follows the rule: each violation on a line of its own (unwrapped, so that
# editors and grep find "src/<file>:<line>:"), then a FATAL_ERROR that counts them.
function(nextn_check_layers src)
  nextn_layer_violations("${src}" problems)
  if(problems STREQUAL "")
    return()
  endif()
  foreach(problem IN LISTS problems)
    message(NOTICE "${problem}")
  endforeach()
  list(LENGTH problems n)
  message(FATAL_ERROR "include layering: ${n} violation(s) above; the rule is in cmake/check_layers.cmake "
                      "and docs/architecture.md (\"Layers\")")
endfunction()

if(CMAKE_SCRIPT_MODE_FILE AND CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  if(NOT NEXTN_LAYER_SRC)
    message(FATAL_ERROR "usage: cmake -DNEXTN_LAYER_SRC=<repo>/src [-DNEXTN_LAYER_STAMP=<file>] -P check_layers.cmake")
  endif()
  nextn_check_layers("${NEXTN_LAYER_SRC}")
  if(NEXTN_LAYER_STAMP)
    file(TOUCH "${NEXTN_LAYER_STAMP}")
  endif()
endif()
