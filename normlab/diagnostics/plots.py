"""PNG plots of ``diagnostics.json`` sections (matplotlib, Agg backend, atomic writes). How to read each plot:
docs/diagnostics.md."""

from __future__ import annotations

from pathlib import Path

from normlab.plotting import pyplot as _plt
from normlab.plotting import save_png as _save


def plot_variance(v: dict, path: Path, title: str = "") -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot(v["depth"], v["var"], "o-", label="variance")
    ax.plot(v["depth"], v["rms"], "s--", label="RMS")
    ax.set_yscale("log")
    ax.set_xticks(v["depth"])
    ax.set_xticklabels(["emb"] + [str(d) for d in v["depth"][1:]])
    ax.set_xlabel("depth (0 = embeddings, l = after block l-1)")
    slope, sb = v.get("log_var_slope"), v.get("log_var_slope_blocks")
    ax.set_title((title + "\n" if title else "") + "residual stream vs depth"
                 + (f": d ln(var)/d depth = {slope:.3f}" if slope is not None else "")
                 + (f" (blocks only {sb:.3f})" if sb is not None else ""), fontsize=10)
    ax.legend()
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path)


def plot_massive(m: dict, path: Path, title: str = "") -> str:
    plt = _plt()
    blocks = m["blocks"]
    fig, ax = plt.subplots(figsize=(max(6.4, 0.5 * len(blocks) + 3), 4.2))
    xs = [b["block"] for b in blocks]
    for r, marker in zip(range(3), ("o", "^", "v")):
        ax.plot(xs, [b["top"][r]["value"] if len(b["top"]) > r else float("nan") for b in blocks], marker,
                ls="-", label=f"top {r + 1} |h|")
    ax.plot(xs, [b["median"] for b in blocks], "k.--", label="median |h|")
    ax.axhline(m["criterion"]["abs_min"], color="red", lw=0.8, ls=":", label="|h| = 100 (criterion)")
    ax.set_yscale("log")
    ax.set_xticks(xs)
    ax.set_xlabel("block")
    mr = m.get("max_ratio")
    ax.set_title((title + "\n" if title else "") + "massive activations per block output"
                 + (f": max top1/median = {mr:.1f}" if mr is not None else ""))
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return _save(fig, path)


def plot_sinks(s: dict, path: Path, title: str = "") -> str:
    plt = _plt()
    imp = s["first_token_importance"]
    L, H = len(imp), len(imp[0]) if imp else 0
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * H + 2.5), max(3.2, 0.45 * L + 1.8)))
    im = ax.imshow(imp, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
    for l in range(L):
        for h in range(H):
            ax.text(h, l, f"{imp[l][h]:.2f}", ha="center", va="center", fontsize=7,
                    color="white" if imp[l][h] < 0.6 else "black")
    ax.set_xticks(range(H))
    ax.set_yticks(range(L))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    fig.colorbar(im, ax=ax, label="first-token importance")
    ax.set_title((title + "\n" if title else "") + f"attention sinks (T={s['context']}): sink rate "
                 f"{s['sink_rate']:.1%} (> {s['epsilon']})", fontsize=10)
    return _save(fig, path)


def plot_effectiveness(e: dict, path: Path, title: str = "") -> str:
    plt = _plt()
    blocks = e["blocks"]
    xs = [b["block"] for b in blocks]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.bar(xs, [r["angular_distance"] for r in blocks], color="tab:blue")
    a.set_xlabel("block")
    a.set_ylabel("angular distance arccos(cos)/pi")
    a.set_title("input vs output direction")
    b.bar(xs, [r["skip_loss_increase"] for r in blocks], color="tab:orange")
    b.axhline(0.0, color="k", lw=0.8)
    b.set_xlabel("block")
    b.set_ylabel("loss increase when skipped (nats/token)")
    b.set_title(f"skip cost (base loss {e['base_loss']:.3f})")
    for ax in (a, b):
        ax.set_xticks(xs)
        ax.grid(alpha=0.3, axis="y")
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def plot_norm_gains(stats: dict, path: Path, title: str = "") -> str | None:
    """Gain distribution per norm site (quantile boxes: 5-95 % whiskers, 25-75 % box, median line)."""
    rows = [(k, v["gain"]) for k, v in stats.items() if "gain" in v and v["gain"]["n"] > 1]
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, max(3.0, 0.3 * len(rows) + 1.5)))
    boxes = [{"label": k, "whislo": g["q05"], "q1": g["q25"], "med": g["q50"], "q3": g["q75"], "whishi": g["q95"],
              "fliers": [g["min"], g["max"]]} for k, g in rows]
    import matplotlib

    major, minor = (int(p) for p in matplotlib.__version__.split(".")[:2])
    orient = {"orientation": "horizontal"} if (major, minor) >= (3, 10) else {"vert": False}
    ax.bxp(boxes, showfliers=True, **orient)
    ax.axvline(1.0, color="k", lw=0.6, ls=":")
    ax.set_xlabel("gain (applied value)")
    ax.set_title((title + "\n" if title else "") + "norm gains (whiskers 5-95 %, dots min/max)")
    return _save(fig, path)


def plot_training(records: list[dict], path: Path, title: str = "") -> str | None:
    """Training-time curves from metrics.jsonl ``diag/...`` records: residual RMS per block, the gradient norms of
    each block's attention parameters (solid) and MLP parameters (dashed) as separate curves (not the per-block norm
    ``normlab.names.block_grad_norms``, which also adds the norm sites), norm output RMS, and the loss with spikes
    marked."""
    stat = [r for r in records if any(k.startswith("diag/resid_rms/") for k in r)]
    if not stat:
        return None
    plt = _plt()
    steps = [r["step"] for r in stat]

    def keys(prefix: str) -> list[str]:
        ks = {k for r in stat for k in r if k.startswith(prefix)}
        def order(k: str) -> tuple:
            tail = k[len(prefix):]
            return (not tail.isdigit(), int(tail) if tail.isdigit() else 0, k)

        return sorted(ks, key=order)

    def series(k: str) -> list[float]:
        return [r.get(k, float("nan")) for r in stat]

    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    ax = axes[0][0]
    if "diag/embed_rms" in stat[0]:
        ax.plot(steps, series("diag/embed_rms"), "k:", label="embed")
    for k in keys("diag/resid_rms/"):
        ax.plot(steps, series(k), label=f"block {k.rsplit('/', 1)[1]}")
    ax.set_yscale("log")
    ax.set_title("residual-stream RMS (block outputs)")
    ax.legend(fontsize=7)
    ax = axes[0][1]
    for i, k in enumerate(keys("diag/grad_norm/attn/")):
        l = k.rsplit("/", 1)[1]
        (line,) = ax.plot(steps, series(k), label=f"block {l} attn")
        mk = f"diag/grad_norm/mlp/{l}"
        if any(mk in r for r in stat):
            ax.plot(steps, series(mk), "--", color=line.get_color(), label=f"block {l} MLP")
    ax.set_yscale("log")
    ax.set_title("gradient norm of attention (solid) and MLP (dashed)\nparameters per block, before clipping",
                 fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    ax = axes[1][0]
    for k in keys("diag/norm_rms/"):
        ax.plot(steps, series(k), label=k.split("/", 2)[2])
    ax.set_title("norm output RMS")
    if len(keys("diag/norm_rms/")) <= 12:
        ax.legend(fontsize=6)
    ax = axes[1][1]
    loss = [r for r in records if "loss" in r and "tokens_per_s" in r]
    if loss:
        ax.plot([r["step"] for r in loss], [r["loss"] for r in loss], label="train loss (logged)")
    spikes = [r for r in records if r.get("diag/loss_spike")]
    for r in spikes:
        ax.axvline(r["step"], color="red", lw=0.8, alpha=0.6)
    ax.set_title(f"loss; {len(spikes)} spike(s) marked in red")
    ax.set_xlabel("step")
    for a in axes.flat:
        a.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def write_plots(diag: dict, records: list[dict], out_dir: Path, title: str = "") -> list[str]:
    """Write every applicable plot into ``out_dir``; returns the file names written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = [plot_variance(diag["variance"], out_dir / "variance_depth.png", title),
             plot_massive(diag["massive"], out_dir / "massive_activations.png", title)]
    if diag["sinks"].get("available"):
        names.append(plot_sinks(diag["sinks"], out_dir / "attention_sinks.png", title))
    names.append(plot_effectiveness(diag["layer_effectiveness"], out_dir / "layer_effectiveness.png", title))
    names.append(plot_norm_gains(diag["norm_params"], out_dir / "norm_gains.png", title))
    names.append(plot_training(records, out_dir / "training_curves.png", title))
    return [n for n in names if n]
