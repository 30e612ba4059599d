"""A numpy-backed stand-in for SGLang's host KV pools (MHATokenToKVPoolHost and
MLATokenToKVPoolHost of sglang 0.5.23): the same buffer shapes per layout and the same
get_page_buffer_meta / get_data_page / get_dummy_flat_data_page contracts, without torch or a GPU."""

import numpy as np


class NumpyHostPool:
    def __init__(self, layout, mla=False, layers=3, heads=2, head_dim=8, kv_dim=24, page_size=4,
                 pages=16, dtype=np.float16):
        self.layout, self.page_size, self.layer_num = layout, page_size, layers
        self.dtype = np.dtype(dtype)
        self.size = pages * page_size
        self.mla = mla
        if mla:
            self.kv_cache_dim = kv_dim
            item = (1, kv_dim)
            shapes = {"layer_first": (layers, self.size) + item,
                      "page_first": (self.size, layers) + item,
                      "page_first_direct": (pages, layers, page_size) + item}
        else:
            self.head_num, self.head_dim = heads, head_dim
            item = (heads, head_dim)
            shapes = {"layer_first": (2, layers, self.size) + item,
                      "page_first": (2, self.size, layers) + item,
                      "page_first_direct": (2, pages, layers, page_size) + item}
        self.kv_buffer = np.zeros(shapes[layout], dtype=self.dtype)

    def _item_bytes(self):
        return (self.kv_cache_dim if self.mla else self.head_num * self.head_dim) * self.dtype.itemsize

    def get_size_per_token(self):
        return self._item_bytes() * self.layer_num * (1 if self.mla else 2)

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        base, it = self.kv_buffer.ctypes.data, self._item_bytes()
        idx = indices.tolist()
        ptrs, sizes = [], []
        v_off = 0 if self.mla else self.layer_num * self.size * it
        for s in idx[::self.page_size]:
            if self.layout == "layer_first":
                for layer in range(self.layer_num):
                    k = base + s * it + layer * self.size * it
                    ptrs += [k] if self.mla else [k, k + v_off]
                sizes += [self.page_size * it] * (self.layer_num * (1 if self.mla else 2))
            else:
                k = base + s * self.layer_num * it
                ptrs += [k] if self.mla else [k, k + v_off]
                sizes += [self.layer_num * self.page_size * it] * (1 if self.mla else 2)
        return ptrs, sizes

    def page(self, index):
        """A copy of the tokens [index, index+page_size) of every layer (K and V), layout-free:
        (kv, layer, token, ...) for MHA and (layer, token, ...) for MLA."""
        ps, kv = self.page_size, self.kv_buffer
        if self.layout == "layer_first":
            v = kv[:, index:index + ps] if self.mla else kv[:, :, index:index + ps]
        elif self.layout == "page_first":
            v = (kv[index:index + ps].swapaxes(0, 1) if self.mla
                 else kv[:, index:index + ps].swapaxes(1, 2))
        else:
            v = kv[index // ps] if self.mla else kv[:, index // ps]
        return np.array(v)

    def fill_page(self, index, rng):
        ps, kv = self.page_size, self.kv_buffer
        if self.layout == "page_first_direct":
            sl = (index // ps,) if self.mla else (slice(None), index // ps)
        elif self.layout == "page_first":
            sl = (slice(index, index + ps),) if self.mla else (slice(None), slice(index, index + ps))
        else:
            sl = ((slice(None), slice(index, index + ps)) if self.mla
                  else (slice(None), slice(None), slice(index, index + ps)))
        kv[sl] = rng.standard_normal(kv[sl].shape).astype(self.dtype)

    def get_data_page(self, index, flat=True):
        return self.page(index).reshape(-1)

    def get_dummy_flat_data_page(self):
        return np.zeros(self.page_size * self.get_size_per_token() // self.dtype.itemsize,
                        dtype=self.dtype)
