#!/usr/bin/env bash
# Installs the Debian packages nextn builds and tests with. Idempotent: installs only what is missing.
set -euo pipefail
pkgs=(g++ cmake ninja-build pkg-config nlohmann-json3-dev libhwy-dev libgtest-dev libgmock-dev libbenchmark-dev
      libpcre2-dev libicu-dev zlib1g-dev
      # make test-asan / make fuzz: clang, its sanitizer and libFuzzer runtimes, llvm-symbolizer for the reports
      clang-14 libclang-rt-14-dev llvm-14)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all packages present"
  exit 0
fi
echo "setup: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
