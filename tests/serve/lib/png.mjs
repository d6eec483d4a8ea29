// Just enough PNG decoding to tell a real screenshot from a blank one: 8-bit RGB / RGBA, not interlaced.
import { inflateSync } from 'node:zlib';

export function decodePng(buf) {
  const sig = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
  if (buf.length < 33 || !buf.subarray(0, 8).equals(sig)) throw new Error('not a PNG (bad signature)');
  let off = 8;
  let ihdr;
  const idat = [];
  while (off + 8 <= buf.length) {
    const len = buf.readUInt32BE(off);
    const type = buf.toString('latin1', off + 4, off + 8);
    const data = buf.subarray(off + 8, off + 8 + len);
    if (type === 'IHDR') {
      ihdr = { width: data.readUInt32BE(0), height: data.readUInt32BE(4), depth: data[8], color: data[9], interlace: data[12] };
    } else if (type === 'IDAT') {
      idat.push(data);
    } else if (type === 'IEND') {
      break;
    }
    off += 12 + len;
  }
  if (!ihdr) throw new Error('PNG without IHDR');
  const channels = { 2: 3, 6: 4 }[ihdr.color];
  if (ihdr.depth !== 8 || !channels || ihdr.interlace !== 0) {
    throw new Error(`unsupported PNG (depth ${ihdr.depth}, color type ${ihdr.color}, interlace ${ihdr.interlace})`);
  }
  const raw = inflateSync(Buffer.concat(idat));
  const stride = ihdr.width * channels;
  if (raw.length !== ihdr.height * (stride + 1)) throw new Error('PNG data has the wrong size');
  const px = Buffer.alloc(ihdr.height * stride);
  for (let y = 0; y < ihdr.height; y++) {
    const f = raw[y * (stride + 1)];
    const src = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1));
    const row = px.subarray(y * stride, (y + 1) * stride);
    const prev = y > 0 ? px.subarray((y - 1) * stride, y * stride) : Buffer.alloc(stride);
    for (let i = 0; i < stride; i++) {
      const a = i >= channels ? row[i - channels] : 0;
      const b = prev[i];
      const c = i >= channels ? prev[i - channels] : 0;
      let v = src[i];
      if (f === 1) v += a;
      else if (f === 2) v += b;
      else if (f === 3) v += (a + b) >> 1;
      else if (f === 4) {
        const p = a + b - c;
        const pa = Math.abs(p - a);
        const pb = Math.abs(p - b);
        const pc = Math.abs(p - c);
        v += pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
      } else if (f !== 0) throw new Error(`bad PNG filter ${f}`);
      row[i] = v & 0xff;
    }
  }
  return { ...ihdr, channels, pixels: px };
}

// {width, height, colors: distinct RGB values, foreground: share of pixels unlike the most common colour}
export function pngStats(buf) {
  const img = decodePng(buf);
  const counts = new Map();
  for (let i = 0; i < img.pixels.length; i += img.channels) {
    const key = (img.pixels[i] << 16) | (img.pixels[i + 1] << 8) | img.pixels[i + 2];
    counts.set(key, (counts.get(key) ?? 0) + 1);
  }
  const total = img.width * img.height;
  const top = Math.max(...counts.values());
  return { width: img.width, height: img.height, colors: counts.size, foreground: 1 - top / total };
}
