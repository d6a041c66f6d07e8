"""The training loop: `Trainer(cfg, run_dir).fit()` and `.evaluate()`.

- Data: the loader's threads read and decode; `DevicePrefetcher` copies the next batch to the device
  (on CUDA on a side stream) while the current step computes.
- Optimizers and the LR schedule: train/optimizers.py.
- bf16 autocast on CUDA; float32 on CPU. The loss is computed in float32.
- NaN/Inf guard (train/step_guard.py, shared with the distributed loop): a step whose loss or gradient norm is
  not finite is skipped (no update) and counted; training stops with an error after `train.nan_guard_max` of
  them. The check, the clipping and the skip stay on the device (fused AdamW's `found_inf`, the tables'
  gradients zeroed), and the flag is read a step or two later, so on CUDA the host does not wait for each step.
- Outputs in the run dir: metrics.jsonl (one JSON per logged step / evaluation), summary.json,
  checkpoints/, tb/ (TensorBoard, if installed), report.html.
- `logging.local_mfu_every: N`: at every N-th step (and the last) the step's batch is also run through each
  dense block alone (train/mfu.py): an `{"kind": "mfu"}` record with local and end-to-end MFU, the
  scaling ratio and a per-block breakdown, and one printed line. The measurement leaves the run unchanged
  (RNG, gradients, buffers restored) and its time is left out of the throughput figures.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from features.errors import GemtrainError
from features.schema import FeatureSchema, load_schema
from ingest.batch import JaggedBatch, PaddingStats
from train import checkpoint as ckpt
from train import ledger
from train.compile import compile_for_run
from train.config import RunConfig
from train.data import DevicePrefetcher, ensure_synthetic, log_stderr, make_loader, real_events
from train.distributed import is_distributed
from train.fp8_saturation import SaturationTally
from train.held_out import HeldOutScorer
from train.metrics import EVAL_RECORD_KEYS, TaskMetrics
from train.optimizers import build_optimizer, lr_factor
from train.precision import apply_config_policy
from train.provenance import software
from train.step_guard import ClippedOptimizer, SkipCounter, count_skipped


class TrainingStopped(GemtrainError):
    """Training stopped early (too many non-finite steps)."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise GemtrainError(f"train.device={name}, but CUDA is not available here (use --train.device=cpu)")
    return dev


@dataclass
class _Window:
    """Running totals between two log lines."""

    t0: float = field(default_factory=time.perf_counter)
    steps: int = 0
    ok_steps: float | torch.Tensor = 0  # steps not skipped by the NaN guard (a device sum under the device guard)
    examples: int = 0
    events: int = 0
    loss_sum: float | torch.Tensor = 0.0  # device sums, read at the log line
    task_loss_sum: dict[str, float | torch.Tensor] = field(default_factory=dict)
    predictions: list[tuple] = field(default_factory=list)  # the steps' TaskMetrics.update arguments, on the device


@dataclass
class _MFUWindow:
    """Wall time (data wait + step) and the step/event counters at the start of an MFU window."""

    seconds: float = 0.0
    step0: int = 0
    events0: int = 0


class Trainer:
    device_guard = True  # False: the NaN guard reads each step's flag on the host (benchmarks/step_guard.py)

    def __init__(self, cfg: RunConfig, run_dir: str | Path | None = None, *, resume: bool = False,
                 model: nn.Module | None = None, quiet: bool = False):
        self.cfg = cfg
        self.run_dir = Path(run_dir) if run_dir else Path("runs") / cfg.name
        # Checkpoints live under the run dir unless checkpoint.url names another place (local or object store).
        self.checkpoint_root: str | Path = cfg.checkpoint.url.rstrip("/") or self.run_dir
        self.resume = resume
        self.log = (lambda _m: None) if quiet else log_stderr
        self.schema: FeatureSchema = load_schema(cfg.schema_path())
        self.tasks = list(self.schema.label_names)
        self.device = resolve_device(cfg.train.device)
        if is_distributed():  # one of several processes (torchrun): its own device, the process group
            from train.dist_trainer import init_distributed

            self.device = init_distributed(cfg)
        if cfg.train.torch_threads:
            torch.set_num_threads(cfg.train.torch_threads)
        self._seed(cfg.train.seed)
        if model is None:
            from model import build_model

            model = build_model(self.schema, cfg.model, device=self.device)
        self.model = model.to(self.device)
        self.precision_report = apply_config_policy(self.model, cfg.precision, cfg.source, self.log)
        # delayed-scaling FP8 layers: how often their casts saturate, sampled at each log line
        self.saturation = SaturationTally() if self.precision_report and self.precision_report.converted else None
        self.compiled_blocks = compile_for_run(self.model, cfg.train.compile, is_distributed(), self.log)
        self.optimizer, self.dense_opt, self.dense_params, self.sparse_params = build_optimizer(self.model, cfg)
        self.autocast = self.device.type == "cuda" and cfg.train.bf16
        self.step = 0
        self.skipped = 0
        self.examples_seen = 0
        self.events_seen = 0
        self.train_time = 0.0
        # Seconds this process's training loop waited for its next batch (not kept in checkpoints; None where the
        # loop does not measure it: the distributed loop overlaps the wait with its pipeline).
        self.data_wait: float | None = 0.0
        # This fit's time before its first step, in that step (compiles land there) and in log lines (None: not
        # measured apart); not kept in checkpoints.
        self.setup_time, self.first_step_time, self.log_time = 0.0, None, 0.0
        self.padding = PaddingStats()
        self.loader_state: Any = None
        self._tb = None
        self._history: list[dict] = []
        self._mfu_win = _MFUWindow()
        self._mfu_last_step = -1

    # ---- set-up -------------------------------------------------------------------------------
    @staticmethod
    def _seed(seed: int) -> None:
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed % 2**32)

    def _loader(self, url: str, *, train: bool) -> Any:
        c = self.cfg
        batch_size = c.train.batch_size if train else (c.eval.batch_size or c.train.batch_size)
        return make_loader(self.schema, c, url, batch_size=batch_size, shuffle=train,
                           epochs=c.data.epochs if train else 1, seed=c.train.seed)

    def _oracle(self, batch: JaggedBatch) -> dict[str, torch.Tensor] | None:
        out = {t: batch.metadata[f"p_{t}"] for t in self.tasks if f"p_{t}" in batch.metadata}
        return out or None

    def _forward_loss(self, batch: JaggedBatch):
        from model.losses import multitask_loss

        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            out = self.model(batch)
        logits = out.logits.float()
        total, per_task = multitask_loss(logits, batch.labels, batch.label_mask, batch.weights, self.tasks)
        aux = out.aux_loss
        if aux is not None and not (isinstance(aux, float | int) and aux == 0):
            total = total + aux.float()
        return total, per_task, logits

    # ---- checkpoints -------------------------------------------------------------------------------
    def _trainer_state(self) -> dict:
        return {"step": self.step, "skipped": self.skipped, "examples_seen": self.examples_seen,
                "events_seen": self.events_seen, "train_time": self.train_time, "padding": self.padding,
                "loader": self.loader_state, "rng": ckpt.rng_state(self.device),
                "lr_schedule": {"kind": self.cfg.optim.decay, "warmup": self.cfg.optim.warmup_steps,
                                "total": self.cfg.train.steps, "base_lr": self.cfg.optim.lr, "step": self.step}}

    def save_checkpoint(self) -> Path:
        path = ckpt.save_checkpoint(self.checkpoint_root, self.step, self.model.state_dict(), self.optimizer.state_dict(),
                                    self._trainer_state(), self.cfg.checkpoint.keep_last)
        self.log(f"checkpoint: {path}")
        return path

    def load_checkpoint(self, path: str | Path, *, model_only: bool = False) -> dict:
        """Restores the model (and, unless model_only, optimizers, step, RNG, loader state)."""
        model_sd = self.model.state_dict()
        optim_sd = None
        if not model_only:
            self.optimizer.init_state()  # creates the lazy optimizer state, which DCP then fills in place
            self.optimizer.zero_grad(set_to_none=True)
            optim_sd = self.optimizer.state_dict()
        state = ckpt.load_checkpoint(path, model_sd, optim_sd)
        self.model.load_state_dict(model_sd)
        if model_only:
            return state
        self.optimizer.load_state_dict(optim_sd)
        self.step = state["step"]
        self.skipped = state["skipped"]
        self.examples_seen = state["examples_seen"]
        self.events_seen = state["events_seen"]
        self.train_time = state["train_time"]
        self.padding = state["padding"]
        self.loader_state = state["loader"]
        ckpt.set_rng_state(state["rng"], self.device)
        return state

    # ---- logging --------------------------------------------------------------------------------
    def _emit(self, rec: dict) -> None:
        self._history.append(rec)
        with open(self.run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(rec, allow_nan=True) + "\n")
        if self._tb is not None:
            prefix = rec.get("kind", "train")
            for k, v in rec.items():
                if isinstance(v, int | float) and k not in ("step",):
                    self._tb.add_scalar(f"{prefix}/{k}", v, rec["step"])

    def _open_logs(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        mpath = self.run_dir / "metrics.jsonl"
        if self.step == 0:
            mpath.write_text("")
        elif mpath.exists():  # drop records past the checkpoint we resumed from
            keep = [ln for ln in mpath.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] <= self.step]
            mpath.write_text("".join(ln + "\n" for ln in keep))
            self._history = [json.loads(ln) for ln in keep]
        (self.run_dir / "config.json").write_text(json.dumps(self.cfg.to_dict(), indent=1, default=str) + "\n")
        if self.cfg.logging.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.run_dir / "tb"))
            except ImportError:
                self._tb = None

    # ---- the loop ------------------------------------------------------------------------------
    def fit(self) -> dict:
        if is_distributed():  # sharded / data-parallel training: train/dist_trainer.py
            from train.dist_trainer import fit_distributed

            if self.cfg.logging.local_mfu_every:  # its blocks run collectives: they cannot be timed alone
                self.log("logging.local_mfu_every: not measured in a distributed run (the sharded blocks run "
                         "collectives); measure local MFU on a single-process run")
            return fit_distributed(self)
        c = self.cfg
        t_start, cpu_start = time.perf_counter(), time.process_time()
        ensure_synthetic(c, self.schema, self.log)
        if self.resume:
            latest = ckpt.latest_checkpoint(self.checkpoint_root)
            if latest is None:
                self.log(f"resume: no complete checkpoint under {self.checkpoint_root}; starting from step 0")
            else:
                self.load_checkpoint(latest)
                self.log(f"resumed from {latest} (step {self.step})")
        self._open_logs()
        loader = self._loader(c.data.train_url, train=True)
        if self.loader_state is not None:
            loader.load_state_dict(self.loader_state)

        total = c.train.steps
        every = c.train.checkpoint_every

        def want_state(batch_index: int) -> bool:  # batch k is trained on by step k + 1
            s = batch_index + 1 + self.step_at_start
            return s == total or (every > 0 and s % every == 0)

        self.step_at_start = self.step
        self._guard = ClippedOptimizer(self.optimizer, self.dense_params, c.optim.clip_grad_norm, distributed=False,
                                       tables=self.sparse_params, device_guard=self.device_guard)
        self._skips = SkipCounter()
        pf = DevicePrefetcher(loader, self.device, want_state, transform=ledger.attach(self, loader))
        train_metrics = TaskMetrics(self.tasks, max_auc_examples=200_000)
        win = _Window()
        pbar = self._progress(total)
        last_eval: dict | None = None
        self.model.train()
        self._mfu_win = _MFUWindow(step0=self.step, events0=self.events_seen)
        batch = None
        self.setup_time = time.perf_counter() - t_start
        try:
            while self.step < total:
                t_iter = time.perf_counter()
                item = pf.next()
                self.data_wait += time.perf_counter() - t_iter
                if item is None:
                    self.log(f"the training data ran out after {self.step} steps (data.epochs={c.data.epochs})")
                    break
                batch, lstate = item
                self._train_step(batch, pf, win)
                self._mfu_win.seconds += time.perf_counter() - t_iter
                if lstate is not None:
                    self.loader_state = lstate
                if self.step % c.train.log_every == 0 or self.step == total:
                    t = time.perf_counter()
                    rec = self._log_train(win, train_metrics, batch)
                    train_metrics.reset()
                    win = _Window()
                    if pbar is not None:
                        pbar.set_postfix_str(self._postfix(rec), refresh=False)
                    self.log_time += time.perf_counter() - t
                if pbar is not None:
                    pbar.update(1)
                mfu_every = c.logging.local_mfu_every
                if mfu_every and (self.step % mfu_every == 0 or self.step == total):
                    t = time.perf_counter()
                    self._measure_mfu(batch)
                    win.t0 += time.perf_counter() - t
                if c.train.eval_every and self.step % c.train.eval_every == 0 and self.step < total and c.data.eval_url:
                    t = time.perf_counter()
                    last_eval = self._eval_and_log()
                    win.t0 += time.perf_counter() - t
                if (every and self.step % every == 0) or (self.step == total and c.checkpoint.at_end):
                    t = time.perf_counter()
                    self._count_skips(wait=True)  # the checkpoint keeps the count
                    self.save_checkpoint()
                    win.t0 += time.perf_counter() - t
        finally:
            if pbar is not None:
                pbar.close()
        self._count_skips(wait=True)
        if c.logging.local_mfu_every and batch is not None and self._mfu_last_step != self.step:
            self._measure_mfu(batch)  # the data ran out before train.steps
        if c.eval.at_end and c.data.eval_url:
            last_eval = self._eval_and_log()
        summary = self._summary(last_eval, time.perf_counter() - t_start)
        summary["cpu_seconds"] = time.process_time() - cpu_start  # all threads of this process
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1, allow_nan=True) + "\n")
        if self._tb is not None:
            self._tb.close()
        if c.logging.report:
            from train.run_report import write_report

            if self.padding.sequences:
                from train.padding_report import render_padding_html

                page = render_padding_html(self.padding, schema=self.schema, token_dim=c.model.d_model,
                                           title=f"Padding seen by training: {c.name}")
                (self.run_dir / "padding_report.html").write_text(page)
                summary["padding_report"] = str(self.run_dir / "padding_report.html")
            summary["report"] = str(write_report(self.run_dir, self._history, summary))
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1, allow_nan=True) + "\n")
        return summary

    def _train_step(self, batch: JaggedBatch, pf: DevicePrefetcher, win: _Window) -> None:
        c = self.cfg
        t_step = time.perf_counter()
        f = lr_factor(self.step, c.optim.warmup_steps, c.train.steps, c.optim.decay, c.optim.min_lr_ratio)
        if self.dense_opt is not None:
            for g in self.dense_opt.param_groups:
                g["lr"] = c.optim.lr * f
        loss, per_task, logits = self._forward_loss(batch)
        loss.backward()
        pf.preload()  # the next batch's copy overlaps this step's backward and update
        self._guard.step(loss=loss)  # clip, check the loss and gradients, update or skip (module docstring)
        ok = self._guard.last_ok  # a bool, or the device flag (read later by _count_skips)
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self._skips.push(self.step, ok)
        ledger.after_step(self)  # rows.jsonl and ledger.json (train/ledger.py)
        n, ev = batch.batch_size, real_events(batch)
        self.examples_seen += n
        self.events_seen += ev
        self.padding += batch.stats
        win.steps += 1
        win.examples += n
        win.events += ev
        # kept on the device and read at the log line, so the host does not wait for this step; a skipped
        # step's terms are masked out
        ok = torch.as_tensor(ok, device=loss.device)
        win.ok_steps = win.ok_steps + ok.float()
        win.loss_sum = win.loss_sum + torch.where(ok, loss.detach().float(), 0.0)
        for k, v in per_task.items():
            win.task_loss_sum[k] = win.task_loss_sum.get(k, 0.0) + torch.where(ok, v.detach().float(), 0.0)
        win.predictions.append((torch.where(ok, torch.sigmoid(logits.detach()), 0.5), batch.labels,
                                batch.label_mask * ok, batch.weights))
        dt = time.perf_counter() - t_step
        self.train_time += dt
        self.first_step_time = dt if self.first_step_time is None else self.first_step_time
        self._count_skips()

    def _count_skips(self, wait: bool = False) -> None:
        """The NaN guard's count from the flags that have arrived (all with `wait`); stops at the limit."""
        count_skipped(self, self._skips, self.log, wait)

    def _achieved_flops(self, batch: JaggedBatch, events: int, seconds: float) -> tuple[float, float | None]:
        """(training TFLOP/s, end-to-end MFU or None) of a log window, from the model's FLOP count of the
        window's last batch scaled to the window's events (one count per log line keeps the loop sync-free)."""
        count = getattr(self.model, "forward_flops", None)
        if count is None:
            return float("nan"), None
        from train.mfu import device_peak_flops

        per_event = 3 * count(batch)["total"] / max(1, real_events(batch))  # forward + backward = 3x forward
        achieved = per_event * events / seconds
        peak = device_peak_flops(self.device, self.cfg.logging.peak_tflops)
        return achieved / 1e12, (achieved / peak if peak else None)

    def _log_train(self, win: _Window, metrics: TaskMetrics, batch: JaggedBatch | None = None) -> dict:
        self._count_skips(wait=True)  # the record's skipped_steps
        if win.predictions:  # one copy to the host for the window
            metrics.update(*(torch.cat(part) for part in zip(*win.predictions)))
        dt = max(time.perf_counter() - win.t0, 1e-9)
        ok_steps = float(win.ok_steps)
        good = max(1.0, ok_steps)
        m = metrics.compute()
        rec: dict[str, Any] = {"kind": "train", "step": self.step,
                               "loss": float(win.loss_sum) / good if ok_steps else float("nan"),
                               "lr": self.cfg.optim.lr * lr_factor(self.step - 1, self.cfg.optim.warmup_steps,
                                                                  self.cfg.train.steps, self.cfg.optim.decay,
                                                                  self.cfg.optim.min_lr_ratio),
                               "examples_per_s": win.examples / dt, "events_per_s": win.events / dt,
                               "skipped_steps": self.skipped}
        for k, v in win.task_loss_sum.items():
            rec[f"loss/{k}"] = float(v) / good
        for t, r in m.items():
            rec[f"ne/{t}"] = r["ne"]
            rec[f"auc/{t}"] = r["auc"]
            rec[f"calibration/{t}"] = r["calibration"]
        if batch is not None and win.events:
            tflops, mfu = self._achieved_flops(batch, win.events, dt)
            rec["tflops_per_s"] = tflops
            if mfu is not None:
                rec["mfu"] = mfu
        if self.saturation is not None:
            rec.update(self.saturation.sample(self.model))
        for name, seq in self.padding.sequences.items():  # cumulative over the batches seen
            rec[f"padding_share/{name}"] = seq.padding_waste_batch_max
            rec[f"attn_padded_over_jagged/{name}"] = seq.attn_saving_batch_max
        self._emit(rec)
        return rec

    def _measure_mfu(self, batch: JaggedBatch) -> dict:
        """Local MFU of the step just taken (each dense block alone on this batch's inputs), end-to-end MFU of
        the steps since the last measurement, the scaling ratio: one `mfu` record and one printed line."""
        from train.mfu import device_peak_flops, measure_step_in_place, mfu_line, mfu_record

        step_flops, layers = measure_step_in_place(
            self.model, lambda: self._forward_loss(batch)[0], self.device,
            autocast_dtype=torch.bfloat16 if self.autocast else None)
        w = self._mfu_win
        rec = mfu_record(self.step, step_flops, real_events(batch), w.seconds, self.step - w.step0,
                         self.events_seen - w.events0, layers,
                         device_peak_flops(self.device, self.cfg.logging.peak_tflops))
        self._emit(rec)
        self.log(mfu_line(rec))
        self._mfu_win = _MFUWindow(step0=self.step, events0=self.events_seen)
        self._mfu_last_step = self.step
        return rec

    def _postfix(self, rec: dict) -> str:
        t0 = self.tasks[0]
        return (f"loss={rec['loss']:.4f} ne={rec.get(f'ne/{t0}', float('nan')):.4f} "
                f"ex/s={rec['examples_per_s']:,.0f} ev/s={rec['events_per_s']:,.0f}")

    def _progress(self, total: int):
        if not self.cfg.logging.progress:
            return None
        from tqdm import tqdm

        return tqdm(total=total, initial=self.step, desc="train", unit="step", dynamic_ncols=True,
                    mininterval=0.5)

    def _eval_and_log(self) -> dict:
        rng = ckpt.rng_state(self.device)  # evaluation must not change the training's random stream
        res = self.evaluate()
        ckpt.set_rng_state(rng, self.device)
        rec: dict[str, Any] = {"kind": "eval", "step": self.step}
        for t, r in res["tasks"].items():
            for k in EVAL_RECORD_KEYS:
                if k in r:
                    rec[f"{k}/{t}"] = r[k]
        self._emit(rec)
        t0 = self.tasks[0]
        r0 = res["tasks"][t0]
        self.log(f"eval @ step {self.step}: {t0} NE {r0['ne']:.4f} (oracle {r0.get('oracle_ne', float('nan')):.4f}) "
                 f"AUC {r0['auc']:.4f} calibration {r0['calibration']:.3f}")
        return res

    @torch.no_grad()
    def evaluate(self, url: str | None = None) -> dict:
        """Held-out metrics per task: NE, AUC, calibration (and oracle NE where the data has it)."""
        own = self.cfg.data.eval_url
        url = url or own
        if not url:
            raise GemtrainError("no held-out data: set data.eval_url")
        was_training = self.model.training
        self.model.eval()
        scorer = HeldOutScorer(self.tasks, self.cfg.eval.save_predictions)
        loader = self._loader(url, train=False)
        pf = DevicePrefetcher(loader, self.device, lambda _i: False)
        t0 = time.perf_counter()
        batches = 0
        while True:
            item = pf.next()
            if item is None:
                break
            batch, _ = item
            pf.preload()
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
                out = self.model(batch)
            scorer.update(batch.row_ids, torch.sigmoid(out.logits.float()), batch.labels, batch.label_mask,
                          batch.weights, self._oracle(batch))
            batches += 1
            if self.cfg.eval.max_batches and batches >= self.cfg.eval.max_batches:
                break
        if was_training:
            self.model.train()
        tasks = scorer.finish(self.run_dir, self.step, None if url == own else url)
        out = {"rows": scorer.rows, "seconds": time.perf_counter() - t0, "tasks": tasks}
        return out if scorer.written is None else {**out, "predictions": str(scorer.written)}

    def _summary(self, last_eval: dict | None, wall: float) -> dict:
        last_train = next((r for r in reversed(self._history) if r.get("kind") == "train"), {})
        last_mfu = next((r for r in reversed(self._history) if r.get("kind") == "mfu"), None)
        return {
            "name": self.cfg.name,
            "run_dir": str(self.run_dir),
            "steps": self.step,
            "skipped_steps": self.skipped,
            "examples": self.examples_seen,
            "events": self.events_seen,
            "train_seconds": self.train_time,
            "data_wait_seconds": self.data_wait,
            "eval_seconds": last_eval["seconds"] if last_eval else None,
            "wall_seconds": wall,
            "setup_seconds": self.setup_time,
            "first_step_seconds": self.first_step_time,
            "log_seconds": self.log_time,
            "examples_per_s": self.examples_seen / self.train_time if self.train_time else 0.0,
            "events_per_s": self.events_seen / self.train_time if self.train_time else 0.0,
            "device": str(self.device),
            "bf16": self.autocast,
            "use_history": bool(getattr(self.cfg.model, "use_history", True)),
            "eval": last_eval["tasks"] if last_eval else None,
            "eval_rows": last_eval["rows"] if last_eval else 0,
            "train_last": {k: v for k, v in last_train.items() if k != "kind"},
            "padding": self.padding.to_dict(),
            "mfu": last_mfu,
            "fp8_saturation": self.saturation.summary() if self.saturation is not None else None,
            "software": software(self.device),
        }
