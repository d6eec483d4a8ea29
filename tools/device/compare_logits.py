"""Compares two `nextn logits --output` files tensor by tensor (no numpy: the GPU machine's python has it, the
CPU machines' may not): max |a - b| / max |a| and whether every row's argmax agrees.

    python3 tools/device/compare_logits.py A.safetensors B.safetensors LABEL
"""
import array, json, struct, sys
def tensors(path):  # name -> (shape, flat floats)
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    out = {}
    for name, t in json.loads(raw[8:8 + n]).items():
        if name != "__metadata__":
            b, e = t["data_offsets"]
            out[name] = (t["shape"], array.array("f", raw[8 + n + b:8 + n + e]))
    return out
def argmax_rows(shape, v):
    w = shape[-1]
    return [max(range(w), key=lambda j: v[r * w + j]) for r in range(len(v) // w)]
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
for name in sorted(a):
    (shape, x), (_, y) = a[name], b[name]
    rel = max(abs(p - q) for p, q in zip(x, y)) / max(1e-6, max(abs(p) for p in x))
    same = argmax_rows(shape, x) == argmax_rows(shape, y)
    print(f"{sys.argv[3]} {name} {shape}: max |a - b| / max|a| = {rel:.2e},",
          "argmax equal" if same else "ARGMAX DIFFERS")
