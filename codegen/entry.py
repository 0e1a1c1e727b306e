"""C entry printer: ``(kernel entry, parameter count, header bytes) -> C text`` of the entry that
a repeated call from Python runs. It takes the ndarray objects themselves (their ``id``) and reads
each one's data pointer, ``header`` bytes into the object, so the call converts no addresses in
Python; its error record lives in the library, one per calling thread."""

from __future__ import annotations


def object_entry(entry: str, params: int, header: int) -> str:
    """``{entry}_objects(o0, .., o{params-1})``: ``entry`` on the arrays whose objects are at
    ``o0..``, with this thread's error record; ``{entry}_failure(out)``: that record, copied to
    ``out`` (two longs) and cleared, for the thread's next call. Both take the name the entry
    has in the library (``{symbol}_objects``) where the build renames it by a macro."""
    objects = ", ".join(f"const char *o{k}" for k in range(params)) or "void"
    data = "".join(f"*(void *const *)(o{k} + {header}), " for k in range(params))
    # named after the entry's symbol, which the build may rename by a macro: pasted after expansion
    name = f"TC_ENTRY_NAME_({entry}, _objects)"
    failure = f"TC_ENTRY_NAME_({entry}, _failure)"
    return ("\n#define TC_ENTRY_PASTE_(a, b) a##b\n"
            "#define TC_ENTRY_NAME_(a, b) TC_ENTRY_PASTE_(a, b)\n"
            f"// {entry} called on ndarray objects: an array's data pointer is {header} bytes into it\n"
            f"static __thread long tc_entry_record[2];\n"
            f"int {name}({objects}) {{\n"
            f"  return {entry}({data}tc_entry_record);\n"
            "}\n"
            f"void {failure}(long *out) {{\n"
            "  out[0] = tc_entry_record[0];\n"
            "  out[1] = tc_entry_record[1];\n"
            "  tc_entry_record[0] = tc_entry_record[1] = 0;\n"
            "}\n")
