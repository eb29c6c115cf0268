"""Decode attention on the CPU: SDPA against two matmuls, by context length (sets MATMUL_ATTENTION_FROM).

30 layers of SmolLM2-135M's heads (9 query, 3 K/V, 64 wide) over a static cache, fp32, 2 threads.
Run: .venv/bin/python benchmarks/decode_attention.py
"""
import torch, time, torch.nn.functional as F
torch.set_num_threads(2)
H,KVH,D=9,3,64; G=H//KVH
def bench_pair(a, b, reps=41):
    """Medians of a and b, alternated rep by rep so that the machine's drift hits both alike."""
    for _ in range(3): a(); b()
    ta, tb = [], []
    for _ in range(reps):
        t = time.perf_counter(); a(); ta.append(time.perf_counter() - t)
        t = time.perf_counter(); b(); tb.append(time.perf_counter() - t)
    ta.sort(); tb.sort()
    return ta[reps // 2], tb[reps // 2]
for n in (1,4):
  for L in (33,64,128,256,512,1024):
    kc=[torch.randn(5,KVH,1100,D) for _ in range(30)]; vc=[torch.randn(5,KVH,1100,D) for _ in range(30)]
    q=torch.randn(n,H,D)
    mask=torch.zeros(n,1,1,L)
    def sdpa():
        for i in range(30):
            F.scaled_dot_product_attention(q.unsqueeze(2), kc[i][0:n,:,:L], vc[i][0:n,:,:L], attn_mask=mask, scale=0.125, enable_gqa=True)
    def mm():
        for i in range(30):
            K=kc[i][0:n,:,:L]; V=vc[i][0:n,:,:L]
            s=torch.matmul(q.view(n,KVH,G,D), K.transpose(-1,-2)).mul_(0.125)
            if n>1: s.add_(mask)
            p=torch.softmax(s,-1)
            torch.matmul(p,V)
    a, b = bench_pair(sdpa, mm)
    o1=F.scaled_dot_product_attention(q.unsqueeze(2), kc[0][0:n,:,:L], vc[0][0:n,:,:L], attn_mask=mask, scale=0.125, enable_gqa=True).squeeze(2)
    K=kc[0][0:n,:,:L]; V=vc[0][0:n,:,:L]
    o2=torch.matmul(torch.softmax(torch.matmul(q.view(n,KVH,G,D), K.transpose(-1,-2))*0.125+mask,-1),V).reshape(n,H,D)
    kvb=30*2*n*KVH*L*D*4
    print(f"n={n} L={L}: sdpa {a*1e3:.2f} ms ({kvb/a/1e9:.1f} GB/s)  matmul {b*1e3:.2f} ms ({kvb/b/1e9:.1f} GB/s) matmul/sdpa {b/a:.2f} err {(o1-o2).abs().max():.1e}")
