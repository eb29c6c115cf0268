"""--compile against eager: decode-only steps of the default model, one process, interleaved.

Prefills `m` sequences of P tokens, then times 21 decode steps of each backend in turn and
prints the largest logit difference. The compile (two graphs) is timed in prepare().
Run: .venv/bin/python benchmarks/compiled_decode.py 32 1,4   (prompt length, batch sizes)
"""
import torch, time, sys
torch.set_num_threads(2)
from prefillbench.backends.torch.backend import TorchBackend
from prefillbench.models import default_model_path
from prefillbench.step import Step, PrefillChunk, DecodeToken
P=int(sys.argv[1]); Ms=[int(a) for a in sys.argv[2].split(",")]
eager = TorchBackend.load(default_model_path(), device="cpu", dtype="float32", threads=2)
comp = TorchBackend.load(default_model_path(), device="cpu", dtype="float32", threads=2, compile_decode=True)
t=time.time()
eager.prepare(max(Ms), P+64, 2048); comp.prepare(max(Ms), P+64, 2048)
print("prepare (compile)", round(time.time()-t,1), "s", comp.metadata().get("compile"))
for M in Ms:
    seqs=list(range(100*M,100*M+M))
    for b in (eager, comp):
        for s in seqs:
            b.execute(Step(prefills=(PrefillChunk(s, tuple(range(1, P+1)), 0, True),)))
    pos=[P]
    def step(b):
        r = b.execute(Step(decodes=tuple(DecodeToken(s, 7, pos[0]) for s in seqs)), return_logits=True)
        return r
    ra, rb = step(eager), step(comp); pos[0]+=1
    err=max(abs(ra.logits[s]-rb.logits[s]).max() for s in seqs)
    te,tc=[],[]
    for r in range(21):
        t=time.perf_counter(); step(eager); te.append(time.perf_counter()-t)
        t=time.perf_counter(); step(comp); tc.append(time.perf_counter()-t)
        pos[0]+=1
    te.sort(); tc.sort()
    print(f"M={M} pos {P}: err {err:.2e} eager {te[10]*1e3:.1f} ms compiled {tc[10]*1e3:.1f} ms -> {M/tc[10]:.0f} t/s, ratio {te[10]/tc[10]:.2f}", flush=True)
    for s in seqs: eager.release(s); comp.release(s)
