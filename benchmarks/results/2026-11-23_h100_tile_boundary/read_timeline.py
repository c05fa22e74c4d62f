"""Read the clock64 stamps a diagnostic v9 build leaves in A's last rows."""
import sys, json, torch
from gemm_ladder.runtime import load
mod = load(sys.argv[1]); n = int(sys.argv[2]) if len(sys.argv) > 2 else 300
M, N, K = mod.M, mod.N, mod.K
dt = getattr(torch, mod.dtype)
A = torch.randn((M, K), device="cuda").to(dt); B = torch.randn((N, K), device="cuda").to(dt)
D = torch.empty((M, N), device="cuda", dtype=dt)
for _ in range(n):
    mod(A, B, out=D)
torch.cuda.synchronize()
rows = A[M - 48:, :256].contiguous().view(torch.int16).cpu().to(torch.int64) & 0xFFFF
out = {}
for cta in range(16):
    for role in range(3):
        r = rows[47 - (cta * 3 + role)]
        v = [int(r[4 * i] | (r[4 * i + 1] << 16) | (r[4 * i + 2] << 32) | (r[4 * i + 3] << 48)) for i in range(64)]
        out[f"{cta}/{role}"] = v
json.dump(out, open(sys.argv[3], "w"))
# summary: per CTA, consumer 0/1: per tile [mainloop issue, drain, chunk waits...]
for cta in range(4):
    t0 = out[f"{cta}/2"][0]
    for role in range(3):
        v = out[f"{cta}/{role}"]
        for t in range(5):
            s = v[t * 12:t * 12 + 11] if role < 2 else v[t * 12:t * 12 + 2]
            if s[0] == 0 or s[0] < t0 or s[0] - t0 > 10**7:
                continue
            print(cta, role, t, [x - t0 for x in s])
