# Golden GPT-dataset indices for tests/unit/data/test_gpt_dataset.cpp, computed with numpy's
# RandomState following Megatron-Core's GPTDataset index construction.
import numpy as np, sys
lengths = [5, 3, 8, 2, 7, 4, 6, 1, 9, 3]
S, seed = 4, 1234
def build(num_samples):
    docs = np.arange(len(lengths), dtype=np.int32)
    tokens = sum(lengths)
    epochs = 1
    while epochs * tokens < num_samples * S + 1: epochs += 1
    sep = False
    if epochs > 1:
        sans = ((epochs - 1) * tokens - 1) // S
        sep = (num_samples - sans) < int(0.80 * ((tokens - 1) // S))
    rs = np.random.RandomState(seed)
    def di(e):
        d = np.mgrid[0:e, 0:len(docs)][1]; d[:] = docs; d = d.reshape(-1).astype(np.int32); rs.shuffle(d); return d
    doc = np.concatenate((di(epochs - 1), di(1))) if sep else di(epochs)
    built = (epochs * tokens - 1) // S
    stream = np.concatenate([np.full(lengths[d], d) for d in doc])
    if sep:
        a = np.arange(0, sans, dtype=np.uint32); rs.shuffle(a)
        b = np.arange(sans, built, dtype=np.uint32); rs.shuffle(b)
        sh = np.concatenate((a, b))
    else:
        sh = np.arange(0, built, dtype=np.uint32); rs.shuffle(sh)
    return epochs, sep, doc.tolist(), sh.tolist()
for n in (20, 13):
    e, sep, doc, sh = build(n)
    print(n, e, sep); print("doc", doc); print("shuffle", sh)
