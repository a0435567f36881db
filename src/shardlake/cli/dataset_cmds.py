"""Commands: query, get, keyset."""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from ..errors import SHOW_MAX
from ..progress.bar import plural
from . import flags
from .common import open_root, print_report
from .flags import Command

if TYPE_CHECKING:
    from shardlake import Keyset

__all__ = ["COMMANDS"]


def _query_flags(p: argparse.ArgumentParser) -> None:
    flags.root(p)
    p.add_argument("--where", metavar="SQL", help="boolean expression over the manifest columns")
    p.add_argument(
        "--columns",
        metavar="COL",
        nargs="+",
        action="extend",
        help="columns to output (default: all); repeatable, and COL may be a comma list "
        "(--columns key,timestamp)",
    )
    flags.version(p)
    p.add_argument("--limit", type=int, default=None, help="print at most this many rows")
    # query prints rows, not a report: its --json is one of three row formats
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="JSON lines, one object per row")
    fmt.add_argument(
        "--csv",
        action="store_true",
        help="CSV with a header row (list and struct columns as JSON text)",
    )
    fmt.add_argument("--count", action="store_true", help="print only the number of rows")


def _get_flags(p: argparse.ArgumentParser) -> None:
    flags.root(p)
    p.add_argument("keys", metavar="KEY", nargs="*")
    flags.keys_file(p, "also fetch the keys listed here")
    flags.version(p)
    p.add_argument("--out", metavar="FILE.npz", help="write the (single) sample to this npz file")
    p.add_argument("--out-dir", metavar="DIR", help="write <key>.npz (+ .json) for every key")
    p.add_argument(
        "--force", action="store_true", help="overwrite files that --out / --out-dir would write"
    )


def _keyset_create_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--where", metavar="SQL", help="boolean expression over the manifest columns")
    flags.keys_file(
        how,
        "text file of keys, or a JSON list of keys / .npz paths; absolute paths under the "
        "packed source map by themselves ('-': stdin)",
    )
    flags.strip_prefix(p)
    p.add_argument(
        "--allow-unmatched",
        type=int,
        metavar="N",
        help="accept exactly N entries that match no key (default 0)",
    )
    flags.version(p)


def _name_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME")


def _keyset_show_flags(p: argparse.ArgumentParser) -> None:
    _name_arg(p)
    p.add_argument("--keys", dest="show_keys", action="store_true", help="print every key")


def _keyset_check_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", metavar="A")
    p.add_argument("b", metavar="B")


def _keyset_rebase_flags(p: argparse.ArgumentParser) -> None:
    _name_arg(p)
    p.add_argument("--version", dest="tag", required=True, metavar="TAG", help="the new version")
    p.add_argument("--as", dest="new_name", required=True, metavar="NEW", help="the new keyset")
    p.add_argument(
        "--strict", action="store_true", help="fail if a key is dropped or its payload changed"
    )


def _diff_flags(p: argparse.ArgumentParser) -> None:
    flags.root(p)
    p.add_argument("a", metavar="A", help="the older version (tag)")
    p.add_argument("b", metavar="B", help="the newer version (tag)")
    p.add_argument("--samples", action="store_true", help="list the keys too")


# --- query / get -------------------------------------------------------------------------------


def cmd_query(args: argparse.Namespace) -> int:
    import pyarrow.csv as pacsv

    from ..errors import UsageError

    if args.limit is not None and args.limit < 0:
        raise UsageError("the row limit must be >= 0", options=("limit",))
    columns = _column_list(args.columns)
    table = open_root(args).dataset(args.tag).query(args.where, columns)
    if args.count:
        print(table.num_rows)
        return 0
    if args.limit is not None:
        table = table.slice(0, args.limit)
    if args.json:
        for row in table.to_pylist():
            sys.stdout.write(json.dumps(row, default=str, sort_keys=False) + "\n")
    elif args.csv:
        buf = io.BytesIO()
        pacsv.write_csv(_nested_as_json(table), buf)
        sys.stdout.write(buf.getvalue().decode())
    else:
        names = table.column_names
        print("\t".join(names))
        for row in _nested_as_json(table).to_pylist():
            print("\t".join("" if row[n] is None else str(row[n]) for n in names))
        sys.stdout.flush()  # a closed pipe ends the command here, before the count
        print(f"({table.num_rows} row{'s' if table.num_rows != 1 else ''})", file=sys.stderr)
    return 0


def _column_list(given: list[str] | None) -> list[str] | None:
    """``--columns`` as given: repeated and comma-separated names, in order, once each."""
    if not given:
        return None
    names = [name.strip() for value in given for name in value.split(",")]
    return list(dict.fromkeys(name for name in names if name))


def _nested_as_json(table: Any) -> Any:
    """List, struct and map columns as JSON text (CSV cells and tab output hold one value)."""
    import pyarrow as pa

    columns = []
    for field, column in zip(table.schema, table.columns, strict=True):
        if pa.types.is_nested(field.type):
            column = pa.array(
                [None if v is None else json.dumps(v, default=str) for v in column.to_pylist()],
                pa.string(),
            )
        columns.append(column)
    return pa.table(columns, names=table.column_names)


def _describe(arrays: dict[str, Any]) -> dict[str, Any]:
    return {
        name: {"dtype": a.dtype.str, "shape": list(a.shape), "nbytes": int(a.nbytes)}
        for name, a in arrays.items()
    }


def cmd_get(args: argparse.Namespace) -> int:
    from ..errors import SelectionError, UsageError

    if not args.keys and not args.keys_file:
        raise UsageError("give at least one KEY", options=("keys",))
    ds = open_root(args).dataset(args.tag)
    keys = list(args.keys)
    if args.keys_file:
        listed = ds.keys_from_file(args.keys_file)
        if listed.unmapped:
            raise SelectionError(
                f"{args.keys_file}: {len(listed.unmapped)} entr(ies) name no key of version "
                f"{ds.tag!r}, e.g. {listed.unmapped[0]!r}"
            )
        keys.extend(listed.keys)
    if not keys:
        raise UsageError("give at least one KEY", options=("keys",))
    if args.out and len(keys) != 1:
        raise UsageError("one output file holds one sample", options=("out_dir",))
    ds.require_keys(keys)  # every key checked before anything is written
    if args.out_dir and os.path.exists(args.out_dir) and not os.path.isdir(args.out_dir):
        raise UsageError(f"{args.out_dir} is a file, not a folder", options=("out_dir",))
    if not args.force:  # refuse before anything is fetched or written
        targets = [args.out] if args.out else []
        if args.out_dir:
            targets += [_out_path(args.out_dir, k, ext) for k in keys for ext in (".npz", ".json")]
        _refuse_existing(targets)
    described: list[dict[str, Any]] = []
    for sample in ds.iter_files(keys):  # every key checked before anything is written
        if args.out:
            _write_file(args.out, sample.npz, args.force)
        if args.out_dir:
            _write_file(_out_path(args.out_dir, sample.key, ".npz"), sample.npz, args.force)
            side = sample.sidecar
            if side is not None:
                _write_file(_out_path(args.out_dir, sample.key, ".json"), side, args.force)
        described.append({"key": sample.key, "arrays": _describe(sample.arrays)})
    doc = described if len(described) != 1 else described[0]
    return print_report(args, doc, lambda: _print_samples(described))


def _print_samples(described: list[dict[str, Any]]) -> None:
    for item in described:
        print(item["key"])
        for name, info in item["arrays"].items():
            print(f"  {name}: {info['dtype']} {tuple(info['shape'])}")


def _out_path(out_dir: str, key: str, suffix: str) -> str:
    return os.path.join(out_dir, *key.split("/")) + suffix


def _refuse_existing(paths: list[str]) -> None:
    from ..errors import ConflictError

    there = [p for p in paths if os.path.lexists(p)]
    if there:
        what = (
            f"{there[0]} and {len(there) - 1} more already exist"
            if there[1:]
            else (f"{there[0]} already exists")
        )
        raise ConflictError(f"{what}; not overwritten", options=("force",))


def _write_file(path: str, data: bytes, force: bool) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    if force:
        os.replace(tmp, path)  # never a half-written npz at the final name
        return
    try:
        os.link(tmp, path)  # atomic create: a file made meanwhile is not overwritten either
    except FileExistsError:
        _refuse_existing([path])
    except OSError:  # no hard links on this filesystem
        _refuse_existing([path])
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


# --- keysets -----------------------------------------------------------------------------------


def cmd_keyset_create(args: argparse.Namespace) -> int:
    from ..errors import UsageError

    if args.where is not None and (args.strip_prefix or args.allow_unmatched is not None):
        raise UsageError(
            "strip_prefix and allow_unmatched go with a key list",
            options=("keys", "strip_prefix", "allow_unmatched"),
        )
    keyset = open_root(args).keysets.create(
        args.name,
        version=args.tag,
        where=args.where,
        key_file=args.keys_file,
        strip_prefix=args.strip_prefix,
        allow_unmatched=args.allow_unmatched,
    )
    return print_report(
        args,
        keyset.info(),
        f"keyset {keyset.name}: {plural(len(keyset), 'sample')} in {len(set(keyset.partitions))} "
        f"partition(s), bound to version {keyset.version_tag} ({keyset.version_hash})",
    )


def cmd_keyset_list(args: argparse.Namespace) -> int:
    keysets = open_root(args).keysets.list()
    return print_report(args, [k.info() for k in keysets], lambda: _print_keysets(keysets))


def _print_keysets(keysets: list[Keyset]) -> None:
    for k in keysets:
        origin = f"\trebased_from: {k.rebased_from}" if k.rebased_from else ""
        print(
            f"{k.name}\t{plural(len(k), 'sample')}\tversion {k.version_tag} ({k.version_hash}){origin}"
        )


def cmd_keyset_show(args: argparse.Namespace) -> int:
    keyset = open_root(args).keysets.get(args.name)
    info = keyset.info()
    keys = keyset.keys if args.show_keys else keyset.keys[:SHOW_MAX]
    more = "" if args.show_keys or len(keyset) <= SHOW_MAX else f" (first {SHOW_MAX})"
    return print_report(args, {**info, "keys": keys}, lambda: _print_keyset(info, keys, more))


def _print_keyset(info: dict[str, Any], keys: list[str], more: str) -> None:
    for name in ("name", "version", "version_hash", "samples", "partitions", "created_at"):
        print(f"{name}: {info[name]}")
    if info.get("rebased_from"):
        print(f"rebased_from: {info['rebased_from']}")
    print(f"recipe: {json.dumps(info['recipe'], sort_keys=True)}")
    print(f"keys{more}:")
    for key in keys:
        print(f"  {key}")


def cmd_keyset_check(args: argparse.Namespace) -> int:
    report = open_root(args).keysets.check_disjoint(args.a, args.b)
    return print_report(
        args, report.to_json(), lambda: _print_overlap(args, report), ok=report.disjoint
    )


def _print_overlap(args: argparse.Namespace, report: Any) -> None:
    if report.disjoint:
        print(f"keysets {args.a} and {args.b} are disjoint")
    else:
        print(f"keysets {args.a} and {args.b} share {plural(report.overlap, 'key')}:")
        for key in report.examples:
            print(f"  {key}")
    if not report.same_version:
        print("note: the two keysets are bound to different versions", file=sys.stderr)


def cmd_keyset_rebase(args: argparse.Namespace) -> int:
    report = open_root(args).keysets.rebase(
        args.name, args.tag, new_name=args.new_name, strict=args.strict
    )
    return print_report(
        args,
        report.to_json(),
        f"keyset {report.name}: {report.kept} kept, {report.dropped} dropped, "
        f"{report.changed} changed; bound to version {report.version} ({report.version_hash}), "
        f"rebased from {report.rebased_from}",
    )


def cmd_keyset_delete(args: argparse.Namespace) -> int:
    keyset = open_root(args).keysets.delete(args.name)
    return print_report(
        args,
        {**keyset.info(), "deleted": True},
        f"keyset {keyset.name} retired (it was bound to version {keyset.version_tag}); "
        "gc releases what only it kept",
    )


def cmd_diff(args: argparse.Namespace) -> int:
    diff = open_root(args).diff(args.a, args.b, samples=args.samples)
    doc = diff.to_json()
    return print_report(args, doc, lambda: _print_diff(diff, doc))


def _print_diff(diff: Any, doc: dict[str, Any]) -> None:
    parts, samples = doc["partitions"], doc["samples"]
    print(f"{diff.from_tag} ({diff.from_hash[:12]}) -> {diff.to_tag} ({diff.to_hash[:12]})")
    print(
        f"partitions: {len(parts['added'])} added, {len(parts['removed'])} removed, "
        f"{len(parts['data_changed'])} data changed, {len(parts['meta_changed'])} meta changed, "
        f"{parts['unchanged']} unchanged"
    )
    print(
        f"samples:    {samples['added']} added, {samples['removed']} removed, "
        f"{samples['changed']} changed, {samples['meta_changed']} meta changed"
    )
    for name in ("added", "removed", "data_changed", "meta_changed"):
        for path in parts[name]:
            print(f"  {name:<13} {path}")
    for name in ("added_keys", "removed_keys", "changed_keys", "meta_changed_keys"):
        for key in samples.get(name) or []:
            print(f"  {name[:-5]:<13} {key}")


_KEYSET_ACTIONS = (
    Command(
        "create",
        cmd_keyset_create,
        _keyset_create_flags,
        help="select samples and publish a keyset (create-if-absent)",
    ),
    Command("list", cmd_keyset_list, help="list the keysets of the root"),
    Command("show", cmd_keyset_show, _keyset_show_flags, help="describe one keyset"),
    Command(
        "check",
        cmd_keyset_check,
        _keyset_check_flags,
        help="prove two keysets disjoint (exit 1 if they overlap)",
    ),
    Command(
        "rebase",
        cmd_keyset_rebase,
        _keyset_rebase_flags,
        help="carry a keyset to another version as a new keyset (the keys it still has)",
    ),
    Command(
        "delete",
        cmd_keyset_delete,
        _name_arg,
        help="delete a keyset (gc then releases what only it kept)",
    ),
)

COMMANDS = (
    Command(
        "query",
        cmd_query,
        _query_flags,
        help="run a sandboxed SQL WHERE over a version's manifests",
        description="Print the manifest rows matching one SQL boolean expression (DuckDB, "
        "sandboxed: no file or network access). Columns with dots need double quotes, "
        "e.g. --where '\"skipping_info.label\" = 3'.",
        json=False,
    ),
    Command(
        "get",
        cmd_get,
        _get_flags,
        help="fetch samples by key (one ranged read each) and show or save their arrays",
        description="Fetch samples by key. With --out a single sample is written as a "
        "bit-exact .npz; --out-dir writes <key>.npz for each key (and <key>.json sidecars).",
    ),
    Command(
        "keyset",
        None,
        flags.root,
        help="named, immutable sample selections bound to one version",
        description="keyset ROOT create NAME (--where SQL | --keys FILE) [--version T]; "
        "keyset ROOT list; keyset ROOT show NAME; keyset ROOT check A B; "
        "keyset ROOT rebase NAME --version B --as NEW; keyset ROOT delete NAME",
        actions=_KEYSET_ACTIONS,
    ),
    Command(
        "diff",
        cmd_diff,
        _diff_flags,
        help="what changed between two versions (partitions and samples)",
        description="Compare version A with version B: partitions added, removed, with "
        "samples added, removed or changed (data_changed) or only new sidecars (meta_changed), "
        "and samples added, removed (remove --keys/--where included), with different payload "
        "bytes (changed; not a different source file) or only a different sidecar "
        "(meta_changed). Reads only the catalog objects that differ.",
    ),
)
