"""safetensors files written by hand, as another framework writes them, for the checkpoint tests."""
import json
import struct
from typing import Dict, List, Tuple


def safetensors_bytes(entries: Dict[str, Tuple[str, List[int], bytes]]) -> bytes:
    """A safetensors file per the format: an 8-byte little-endian header length, the JSON header, the data.
    ``entries`` maps a name to (dtype name, shape, raw bytes)."""
    header, blob = {}, b""
    for name, (dtype, shape, raw) in entries.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + blob
