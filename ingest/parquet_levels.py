"""List lengths of a Parquet list column from its repetition/definition levels alone, never its values.

Reading a leaf through pyarrow decodes every value of it: O(events). The length of each row's list
is already in the leaf's repetition levels (0 starts a row), which Parquet stores RLE/bit-packed:
a history of 2000 events is typically one bit-packed group (its leading 0) plus one RLE run of 1s.
This module walks the column chunk's pages (a minimal Thrift compact-protocol reader for the page
headers), decompresses a V1 page only to reach its levels (V2 levels are stored uncompressed), and
turns the level RUNS into row lengths without expanding them: O(runs + rows), not O(events).

It handles the standard 3-level list layout (`seq.list.element.leaf`, max repetition level 1)
written by Arrow, Spark and others, in V1 or V2 data pages, with any codec pyarrow can decompress.
Anything else raises `Unsupported`, and the caller reads through pyarrow instead.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["Unsupported", "LevelLayout", "layout_for", "chunk_list_lengths"]

_CODECS = {"UNCOMPRESSED": None, "ZSTD": "zstd", "SNAPPY": "snappy", "GZIP": "gzip", "BROTLI": "brotli",
           "LZ4_RAW": "lz4_raw"}
_RLE = 3
_DATA_PAGE, _DICT_PAGE, _DATA_PAGE_V2 = 0, 2, 3


class Unsupported(Exception):
    """The column chunk is not in a layout this reader handles (the caller falls back to pyarrow)."""


# ---- Thrift compact protocol (just enough for PageHeader) --------------------------------------


def _varint(buf, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _zigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _skip(buf, pos: int, ftype: int) -> int:
    if ftype in (1, 2):  # bool in a field header
        return pos
    if ftype == 3:
        return pos + 1
    if ftype in (4, 5, 6):
        return _varint(buf, pos)[1]
    if ftype == 7:
        return pos + 8
    if ftype == 8:
        n, pos = _varint(buf, pos)
        return pos + n
    if ftype in (9, 10):
        h = buf[pos]
        pos += 1
        size, etype = h >> 4, h & 0x0F
        if size == 15:
            size, pos = _varint(buf, pos)
        for _ in range(size):
            pos = pos + 1 if etype in (1, 2) else _skip(buf, pos, etype)
        return pos
    if ftype == 11:
        size, pos = _varint(buf, pos)
        if size:
            kv = buf[pos]
            pos += 1
            for _ in range(size):
                pos = _skip(buf, pos, kv >> 4)
                pos = _skip(buf, pos, kv & 0x0F)
        return pos
    if ftype == 12:
        return _struct(buf, pos, {})[1]
    raise Unsupported(f"thrift type {ftype}")


def _struct(buf, pos: int, want: dict[int, str]) -> tuple[dict, int]:
    """Reads a struct; keeps the int/bool/struct fields named in `want` ({id: name}; '>name' = struct)."""
    out: dict = {}
    last = 0
    while True:
        h = buf[pos]
        pos += 1
        if h == 0:
            return out, pos
        delta, ftype = h >> 4, h & 0x0F
        if delta:
            fid = last + delta
        else:
            raw, pos = _varint(buf, pos)
            fid = _zigzag(raw)
        last = fid
        name = want.get(fid)
        if name is None:
            pos = _skip(buf, pos, ftype)
        elif ftype in (1, 2):
            out[name] = ftype == 1
        elif ftype in (4, 5, 6):
            raw, pos = _varint(buf, pos)
            out[name] = _zigzag(raw)
        elif ftype == 12:
            sub = _SUB[name]
            out[name], pos = _struct(buf, pos, sub)
        else:
            pos = _skip(buf, pos, ftype)


_V1 = {1: "num_values", 3: "def_enc", 4: "rep_enc"}
_V2 = {1: "num_values", 5: "def_len", 6: "rep_len", 7: "is_compressed"}
_SUB = {"v1": _V1, "v2": _V2}
_PAGE = {1: "type", 2: "uncompressed", 3: "compressed", 5: "v1", 8: "v2"}


# ---- RLE / bit-packed hybrid levels, kept as runs ---------------------------------------------


class _Levels:
    """Runs of one level stream over a column chunk: positions (global value index) below `low`."""

    def __init__(self, bw: int, low: int):
        self.bw, self.low = bw, low
        self.rle_start: list[int] = []  # RLE runs whose level is < low: (start, count)
        self.rle_count: list[int] = []
        self.bp_bytes: list[bytes] = []  # bit-packed groups, unpacked together at the end
        self.bp_start: list[int] = []
        self.bp_clip: list[tuple[int, int]] = []  # (group, values cut): a page's last group may be padded

    def scan(self, data: bytes, n: int, base: int) -> None:
        """The runs of one page's levels (n values, the first at global index `base`)."""
        # The hot loop of the scan: one iteration per run, a few per row, none per event.
        pos, i, bw, low = 0, 0, self.bw, self.low
        vbytes = (bw + 7) // 8
        rs, rc, bb, bs = self.rle_start, self.rle_count, self.bp_bytes, self.bp_start
        last_bp = False
        try:
            while i < n:
                h = data[pos]
                pos += 1
                if h >= 0x80:  # a varint header: usually 2 bytes
                    b = data[pos]
                    pos += 1
                    h = (h & 0x7F) | ((b & 0x7F) << 7)
                    shift = 14
                    while b >= 0x80:
                        b = data[pos]
                        pos += 1
                        h |= (b & 0x7F) << shift
                        shift += 7
                if h & 1:
                    g = h >> 1
                    bb.append(data[pos:pos + g * bw])
                    bs.append(base + i)
                    pos += g * bw
                    i += g * 8
                    last_bp = True
                else:
                    count = h >> 1
                    v = data[pos] if vbytes == 1 else int.from_bytes(data[pos:pos + vbytes], "little")
                    pos += vbytes
                    if v < low:
                        rs.append(base + i)
                        rc.append(count)
                        last_bp = False
                    else:
                        last_bp = None  # type: ignore[assignment]
                    i += count
        except IndexError:
            raise Unsupported("level data ended early") from None
        if i > n:  # the last run of a page may be padded past its values
            if last_bp is True:
                self.bp_clip.append((len(bb) - 1, i - n))
            elif last_bp is False:
                rc[-1] -= i - n

    def below(self) -> np.ndarray:
        """Sorted global positions whose level is < low."""
        parts = []
        if self.rle_start:
            st = np.asarray(self.rle_start, np.int64)
            ct = np.asarray(self.rle_count, np.int64)
            off = np.cumsum(ct) - ct
            parts.append(np.arange(int(ct.sum()), dtype=np.int64) + np.repeat(st - off, ct))
        if self.bp_bytes:
            bw = self.bw
            raw = np.frombuffer(b"".join(self.bp_bytes), np.uint8)
            bits = np.unpackbits(raw, bitorder="little")
            vals = bits if bw == 1 else bits.reshape(-1, bw) @ (1 << np.arange(bw, dtype=np.int64))
            sizes = np.fromiter(map(len, self.bp_bytes), np.int64, len(self.bp_bytes)) * 8 // bw
            counts = sizes.copy()  # valid values per group
            for k, cut in self.bp_clip:
                counts[k] -= cut
            starts = np.asarray(self.bp_start, np.int64)
            first = np.cumsum(sizes) - sizes  # where each group's values begin in `vals`
            offs = np.cumsum(counts) - counts
            j = np.arange(int(counts.sum()), dtype=np.int64)
            keep = j + np.repeat(first - offs, counts)
            glob = j + np.repeat(starts - offs, counts)
            parts.append(glob[vals[keep] < self.low])
        if not parts:
            return np.zeros(0, np.int64)
        out = np.concatenate(parts)
        out.sort()
        return out


# ---- one column chunk -------------------------------------------------------------------------


class LevelLayout:
    """Where a list leaf's levels live and what they mean."""

    def __init__(self, column_index: int, max_def: int, nonempty_def: int):
        self.column_index = column_index
        self.max_def = max_def
        self.nonempty_def = nonempty_def  # def level >= this: the row's list holds an element
        self.def_bw = max_def.bit_length()


def layout_for(pf: pq.ParquetFile, column_index: int, seq: str) -> LevelLayout:
    """Checks the leaf is `seq.<list>.<element>.<leaf>` in the standard 3-level list layout."""
    col = pf.metadata.schema.column(column_index)
    parts = col.path.split(".")
    if col.max_repetition_level != 1 or len(parts) != 4:
        raise Unsupported(f"column {col.path}: not a 3-level list of structs")
    top = pf.schema_arrow.field(seq)
    if not pa.types.is_list(top.type) or not pa.types.is_struct(top.type.value_type):
        raise Unsupported(f"column {seq}: not list<struct>")
    elem = top.type.value_field
    leaf = elem.type.field(parts[3])
    expect = int(top.nullable) + 1 + int(elem.nullable) + int(leaf.nullable)
    if col.max_definition_level != expect:
        raise Unsupported(f"column {col.path}: unexpected definition levels")
    return LevelLayout(column_index, col.max_definition_level, int(top.nullable) + 1)


def chunk_list_lengths(buf, md_column, layout: LevelLayout, num_rows: int) -> np.ndarray:
    """Row lengths of one column chunk; `buf` holds the chunk's bytes (from its first page)."""
    codec_name = md_column.compression
    codec = pa.Codec(_CODECS[codec_name]) if _CODECS.get(codec_name) else None
    pos, end, base = 0, len(buf), 0
    rep = _Levels(1, 1)  # rep level 0: a row starts here
    dfn = _Levels(layout.def_bw, layout.nonempty_def)  # def level below nonempty_def: no element
    while pos < end:
        hdr, pos = _struct(buf, pos, _PAGE)
        size = hdr.get("compressed", 0)
        ptype = hdr.get("type")
        body = buf[pos:pos + size]
        pos += size
        if ptype == _DATA_PAGE:
            v1 = hdr.get("v1") or {}
            n = v1["num_values"]
            if v1.get("rep_enc", _RLE) != _RLE or v1.get("def_enc", _RLE) != _RLE:
                raise Unsupported("levels not RLE-encoded")
            if codec_name not in _CODECS:  # V1 levels are inside the compressed page
                raise Unsupported(f"codec {codec_name}")
            data = codec.decompress(body, decompressed_size=hdr["uncompressed"], asbytes=True) if codec else body
            data = memoryview(data)
            rlen = int.from_bytes(data[0:4], "little")
            rep.scan(bytes(data[4:4 + rlen]), n, base)
            d0 = 4 + rlen
            dlen = int.from_bytes(data[d0:d0 + 4], "little")
            dfn.scan(bytes(data[d0 + 4:d0 + 4 + dlen]), n, base)
        elif ptype == _DATA_PAGE_V2:
            v2 = hdr["v2"]
            n = v2["num_values"]
            rlen, dlen = v2.get("rep_len", 0), v2.get("def_len", 0)
            rep.scan(bytes(body[:rlen]), n, base)
            dfn.scan(bytes(body[rlen:rlen + dlen]), n, base)
        elif ptype in (_DICT_PAGE, 1):
            continue
        else:
            raise Unsupported(f"page type {ptype}")
        base += n
    starts = rep.below()
    if starts.size != num_rows:
        raise Unsupported(f"found {starts.size} row starts, the footer says {num_rows}")
    lengths = np.diff(np.append(starts, base))
    empty = dfn.below()
    if empty.size:
        # A row whose first level says "no element" is an empty or null list: length 0.
        idx = np.searchsorted(starts, empty)
        hit = (idx < starts.size) & (starts[np.minimum(idx, starts.size - 1)] == empty)
        lengths[idx[hit]] = 0
    return lengths


def first_page_has_crc(fh, metadata: pq.FileMetaData) -> bool | None:
    """Whether the file's first page header carries a CRC (the writer had page checksums on).

    Writers set checksums for a whole file, so the first page speaks for all of them. None when the
    file has no pages to look at (no row groups or no columns)."""
    if metadata.num_row_groups == 0 or metadata.num_columns == 0:
        return None
    chunk = metadata.row_group(0).column(0)
    offset = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    if offset is None or offset < 0:
        return None
    fh.seek(offset)
    head = fh.read(512)  # a page header is a few dozen bytes
    hdr, _ = _struct(head, 0, {1: "type", 4: "crc"})
    return "crc" in hdr
