#!/usr/bin/env bash
# Packs the Release binaries with this machine's shared libraries and loader into devrun/ (git-ignored),
# so that the GPU machine's host CPUs, which have no compiler or packages, can run them:
#   bash tools/device/pack_cpu_binaries.sh [BUILD_DIR]
#   (device) devrun/run nextn bench --synthetic --dtype fp8 --cache-dir /tmp/nx      # carry: ["devrun"]
# The ICU data library is replaced by an empty stub (30 MB): `bench` on a synthetic checkpoint and the
# kernel benchmarks never tokenize. Anything that does (text prompts, the bundled model) needs the real one.
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/../.." && pwd)
out="$root/devrun"
rm -rf "$out" && mkdir -p "$out/lib"
for b in nextn nextn_bench_kernels nextn_bench_cuda nextn_tests; do
  [ -x "$root/$build/bin/$b" ] && cp "$root/$build/bin/$b" "$out/"
done
ldd "$out"/nextn* | awk '$3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in libicudata.so.*) continue ;; esac
  cp -L "$lib" "$out/lib/"
done
cp -L /lib64/ld-linux-x86-64.so.2 "$out/lib/"
icudata=$(ldd "$out/nextn" | awk '/libicudata/ {print $1}')
if [ -n "$icudata" ]; then
  sym=$(nm -D "$(ldd "$out/nextn" | awk '/libicudata/ {print $3}')" | awk '/ R icudt/ {print $3}')
  printf 'const char %s[64] = {0};\n' "$sym" > "$out/icustub.c"
  gcc -shared -fPIC -Wl,-soname,"$icudata" "$out/icustub.c" -o "$out/lib/$icudata"
  rm "$out/icustub.c"
fi
cat > "$out/run" <<'RUN'
#!/usr/bin/env bash
# devrun/run PROGRAM ARGS...: runs devrun/PROGRAM with the packed loader and libraries.
d=$(cd "$(dirname "$0")" && pwd)
prog=$1; shift
exec "$d/lib/ld-linux-x86-64.so.2" --library-path "$d/lib" "$d/$prog" "$@"
RUN
chmod +x "$out/run"
grep -qx '/devrun/' "$root/.git/info/exclude" 2>/dev/null || echo '/devrun/' >> "$root/.git/info/exclude"
du -sh "$out"
