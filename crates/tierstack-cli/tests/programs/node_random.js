// An 800 MB Float64Array filled and read at random (issue 19): prints one line that must be
// the same natively and under `tierstack run`.
const n = 100_000_000;
const a = new Float64Array(n);
for (let i = 0; i < n; i += 512) a[i] = i;
let s = 0;
let x = 12345;
for (let k = 0; k < 50_000; k++) {
  x = (x * 1103515245 + 12345) % 2147483648;
  s += a[(x % ((n / 512) | 0)) * 512];
}
console.log("sum", s);
