#!/usr/bin/env bash
# Installs the Debian packages nextn builds and tests with. Idempotent: installs only what is missing.
set -euo pipefail
pkgs=(g++ cmake ninja-build pkg-config nlohmann-json3-dev libhwy-dev libgtest-dev libgmock-dev libbenchmark-dev
      libpcre2-dev libicu-dev zlib1g-dev
      # make test-asan / make fuzz: clang, its sanitizer and libFuzzer runtimes, llvm-symbolizer for the reports
      clang-14 libclang-rt-14-dev llvm-14
      # nextn serve: HTTP (cpp-httplib, built with OpenSSL/zlib/brotli, whose headers its own header includes)
      libcpp-httplib-dev libssl-dev libbrotli-dev
      # the server's tests: node + npm (the openai client, playwright-core), headless Chromium for the chat page,
      # Debian's python3-jinja2 as the oracle of our chat-template renderer
      nodejs chromium python3-jinja2)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm: Debian's own package, unless the installed Node.js brings its own (nodesource's does; the two conflict).
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all packages present"
else
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The server's JavaScript test clients, exactly as package-lock.json pins them (from the npm registry).
cd "$(dirname "$0")/../tests/serve"
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  echo "setup: npm ci (tests/serve)"
  npm ci --no-audit --no-fund --loglevel=error
fi
