"""What every mmtf task offers the CLIs (``evaluate``, ``predict``, ``export``).

A task is a LightningModule around one mmtf encoder. Besides Lightning's hooks it offers
``encoder`` and ``modality``, :meth:`Task.connect_data` (checks against the data module),
``use_tokenizer`` (tasks that emit text), :meth:`Task.update_generation`,
:meth:`Task.predict_batch`, :meth:`Task.export_parts`, fine-tuning controls per part
(:meth:`Task.init_finetuning`) and LoRA (:meth:`Task.init_lora`); every checkpoint stores the
composed config and the tokenizer as plain data under ``checkpoint["mmtf"]``. Why:
docs/design/task-interface.md, finetuning-controls.md, lora.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from mmtf.data.collate import Modality
from mmtf.encoders import AudioEncoder, Encoder
from mmtf.errors import ConfigError, UserError

if TYPE_CHECKING:
    from mmtf.nn.lora import LoRAConfig
    from mmtf.tasks.optim import PartOptim
    from mmtf.text import Tokenizer

# LoRA, FSDP and the optimizer groups are imported where used: predicting loads none of them.


@dataclass(frozen=True)
class Finetuning:
    """The fine-tuning controls of an encoder-decoder task (``model.finetuning``); see
    :meth:`Task.init_finetuning`."""

    freeze_decoder: bool = False
    unfreeze_encoder_at_epoch: int | None = None
    unfreeze_decoder_at_epoch: int | None = None
    encoder_lr_scale: float = 1.0
    decoder_lr_scale: float = 1.0
    layer_decay: float | None = None


class Task(L.LightningModule):
    """Base class of the mmtf tasks; subclasses set ``encoder`` and implement the methods below."""

    encoder: nn.Module
    # Reads or writes text with a tokenizer the entry point hands over (use_tokenizer).
    reads_text: ClassVar[bool] = False

    def __init__(self) -> None:
        super().__init__()
        self.run_config: dict | None = None   # the composed config, stored in checkpoints
        self.tokenizer: Any = None            # mmtf.text.Tokenizer of tasks that emit text
        # split -> rows {"id", "prediction", "references"} of the last scored epoch
        self.last_predictions: dict[str, list[dict[str, Any]]] = {}
        # Fine-tuning controls, set by init_finetuning: part -> epoch / lr scale; the parts
        # frozen here rather than by their own freeze() (the decoder); layer-wise decay.
        self.unfreeze_at: dict[str, int] = {}
        self.lr_scale: dict[str, float] = {}
        self.layer_decay: float | None = None
        self._pinned_eval: set[str] = set()
        self.finetuning_key = "model"         # where the controls' keys live in the config
        # LoRA (init_lora): its config and the parts that carry adapters.
        self.lora: LoRAConfig | None = None
        self.lora_parts: tuple[str, ...] = ()

    @property
    def modality(self) -> Modality:
        """The input modality: ``audio`` (waveforms + lengths) or ``image`` (b, 3, h, w)."""
        return "audio" if isinstance(self.encoder, AudioEncoder) else "image"

    def attached_trainer(self) -> L.Trainer | None:
        """The Trainer running this task; None outside one."""
        try:
            return self.trainer
        except RuntimeError:       # Lightning: "... is not attached to a `Trainer`"
            return None

    def configure_model(self) -> None:
        # trainer=fsdp: one FSDP2 shard unit per transformer block; other strategies: nothing.
        from mmtf.tasks.fsdp import shard_model

        shard_model(self)

    def setup(self, stage: str) -> None:
        if stage == "fit" and self.unfreeze_at:
            self.check_unfreeze_strategy()
        trainer = self.attached_trainer()
        if trainer is not None and trainer.datamodule is not None:
            self.connect_data(trainer.datamodule)

    # ------------------------------------------------------------------ LoRA
    def init_lora(self, lora: Mapping[str, Any] | None) -> None:
        """Add LoRA adapters to the parts ``lora["parts"]`` (``model.lora``; None = off), after
        their pretrained weights loaded, leaving only adapters, the chosen biases and new layers
        trainable there; ``lora["pretrained"]`` loads a PEFT adapter folder instead.

        Raises:
            ConfigError: an unknown part or key, or a setting LoRA rejects.
        """
        if lora is None:
            return
        from mmtf.nn.lora import LoRAConfig, add_lora

        spec = dict(lora)
        parts = self.export_parts()
        names = spec.pop("parts", None)
        names = list(parts) if names is None else list(names)
        unknown = [n for n in names if n not in parts]
        if unknown or not names:
            raise ConfigError(f"model.lora.parts: {unknown or '[]'} is not a part of a "
                              f"{type(self).__name__}, whose parts are {list(parts)}; set "
                              f"model.lora.parts=[{','.join(parts)}].")
        pretrained = spec.pop("pretrained", None)
        allowed = {"r", "alpha", "dropout", "targets", "bias"}
        extra = sorted(set(spec) - allowed)
        if extra:
            raise ConfigError(f"model.lora.{extra[0]} is not a LoRA setting; the keys are "
                              f"{sorted(allowed | {'parts', 'pretrained'})}.")
        if "targets" in spec:
            spec["targets"] = tuple(spec["targets"])
        config = LoRAConfig(**spec)
        if pretrained is not None:
            from mmtf.pretrained.peft import load_peft_adapter

            config, names = load_peft_adapter(pretrained, {n: parts[n] for n in names}, config)
        else:
            for name in names:
                add_lora(parts[name], config, owner=f"model.{name}")
        self.lora, self.lora_parts = config, tuple(names)
        for name in names:
            part = parts[name]
            if isinstance(part, Encoder) and part.frozen:   # built frozen: the adapters too,
                part.freeze()                                # until it unfreezes
            else:
                self.set_lora_trainable(name)

    def resolved_lora(self) -> dict[str, Any] | None:
        """``model.lora`` as built (a PEFT folder's settings written out), for the stored config."""
        if self.lora is None:
            return None
        c = self.lora
        return {"r": c.r, "alpha": c.alpha, "dropout": c.dropout, "targets": list(c.targets),
                "bias": c.bias, "parts": list(self.lora_parts), "pretrained": None}

    def set_lora_trainable(self, name: str) -> None:
        """In part ``name`` under LoRA, only adapters, the chosen biases and new layers train."""
        trainable = self.lora_trainable_ids(name)
        for param in self.export_parts()[name].parameters():
            param.requires_grad_(id(param) in trainable)

    def lora_trainable_ids(self, name: str) -> frozenset[int] | None:
        """ids of the parameters of part ``name`` that can ever train (None: all of them)."""
        if name not in self.lora_parts:
            return None
        from mmtf.nn.lora import lora_trainable, new_parameter_names

        part = self.export_parts()[name]
        new = new_parameter_names(part)
        return frozenset({id(p) for p in lora_trainable(part, self.lora.bias)}
                         | {id(p) for n, p in part.named_parameters() if n in new})

    # ------------------------------------------------------------------ fine-tuning controls
    def init_finetuning(self, *, freeze: Mapping[str, bool], unfreeze_at: Mapping[str, int | None],
                        lr_scale: Mapping[str, float], layer_decay: float | None) -> None:
        """Freeze parts, schedule their unfreezing and set their learning rates; checks each value.

        Args:
            freeze: part -> freeze it now (parts without their own ``freeze``).
            unfreeze_at: part -> epoch at whose start a frozen part becomes trainable (None:
                never); also when a resumed run starts past it.
            lr_scale: part -> multiplier of the optimizer's lr for its parameters.
            layer_decay: layer-wise lr decay inside each part (None = off), in (0, 1].

        Raises:
            UserError: a value out of range, an unfreeze epoch for an unfrozen part, or nothing
                left to train.
        """
        parts = self.export_parts()
        for name, flag in freeze.items():
            if flag:
                self.set_part_frozen(name, True)
        for name, scale in lr_scale.items():
            if not scale > 0:
                raise UserError(f"{self.finetuning_key}.{name}_lr_scale ({scale}) must be > 0; freeze the "
                                f"{name} ({self.freeze_key(name)}=true) to keep it fixed.")
        if layer_decay is not None and not 0.0 < layer_decay <= 1.0:
            raise UserError(f"{self.finetuning_key}.layer_decay ({layer_decay}) must be in (0, 1] (e.g. 0.75), "
                            f"or null for none.")
        for name, epoch in unfreeze_at.items():
            if epoch is None:
                continue
            if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
                raise UserError(f"{self.finetuning_key}.unfreeze_{name}_at_epoch ({epoch!r}) must be an epoch "
                                f">= 0 or null.")
            if not self.part_frozen(name):
                raise UserError(f"{self.finetuning_key}.unfreeze_{name}_at_epoch ({epoch}) is set but the {name} "
                                f"is not frozen; set {self.freeze_key(name)}=true or "
                                f"{self.finetuning_key}.unfreeze_{name}_at_epoch=null.")
        if not any(p.requires_grad for p in self.parameters()):
            raise UserError(f"every part is frozen ({', '.join(self.freeze_key(n) for n in parts)})"
                            f": nothing trains in epoch 0; leave one part trainable and unfreeze "
                            f"the other later with {self.finetuning_key}.unfreeze_<part>_at_epoch.")
        self.unfreeze_at = {k: v for k, v in unfreeze_at.items() if v is not None}
        self.lr_scale = dict(lr_scale)
        self.layer_decay = layer_decay

    def freeze_key(self, name: str) -> str:
        """The config key that freezes part ``name``."""
        return (f"model.{name}.freeze" if isinstance(self.export_parts()[name], Encoder)
                else f"{self.finetuning_key}.freeze_{name}")

    def part_frozen(self, name: str) -> bool:
        """Whether part ``name`` is frozen (no trainable parameters, pinned in eval mode)."""
        part = self.export_parts()[name]
        return part.frozen if isinstance(part, Encoder) else name in self._pinned_eval

    def set_part_frozen(self, name: str, frozen: bool) -> None:
        """Freeze or unfreeze part ``name`` (``requires_grad`` and eval mode); an encoder does
        it itself, any other part is pinned in eval mode by :meth:`train`."""
        part = self.export_parts()[name]
        if isinstance(part, Encoder):
            if frozen:
                part.freeze()
            else:
                part.unfreeze(train=self.training)
                if name in self.lora_parts:           # unfrozen = its adapters train again
                    self.set_lora_trainable(name)
            return
        part.requires_grad_(not frozen)
        if not frozen and name in self.lora_parts:
            self.set_lora_trainable(name)
        if frozen:
            self._pinned_eval.add(name)
        else:
            self._pinned_eval.discard(name)
        part.train(self.training and not frozen)

    def train(self, mode: bool = True) -> Task:
        # A frozen part stays in eval mode whatever is asked: its dropout must stay off.
        super().train(mode)
        parts = self.export_parts() if self._pinned_eval else {}
        for name in self._pinned_eval:
            parts[name].train(False)
        return self

    def optim_parts(self) -> dict[str, PartOptim]:
        """The parts with their lr scale, frozen parameters kept when they unfreeze later."""
        from mmtf.tasks.optim import PartOptim

        return {name: PartOptim(part, self.lr_scale.get(name, 1.0), name in self.unfreeze_at,
                                self.lora_trainable_ids(name))
                for name, part in self.export_parts().items()}

    def on_train_epoch_start(self) -> None:
        self.unfreeze_due_parts()

    def unfreeze_due_parts(self) -> None:
        """Unfreeze every frozen part whose epoch has come (also when a resumed run starts past
        it), then rebuild the DDP wrapper, on every rank alike: the epoch is the same on all."""
        due = [name for name, epoch in self.unfreeze_at.items()
               if self.current_epoch >= epoch and self.part_frozen(name)]
        for name in due:
            self.set_part_frozen(name, False)
        if due:
            rebuild_ddp(self.trainer)

    def check_unfreeze_strategy(self) -> None:
        """Unfreezing at an epoch is built for one device and DDP (:func:`rebuild_ddp`) only."""
        strategy = self.trainer.strategy
        if not isinstance(strategy, (SingleDeviceStrategy, DDPStrategy)):
            name = next(iter(self.unfreeze_at))
            raise UserError(f"{self.finetuning_key}.unfreeze_{name}_at_epoch is set but the trainer's strategy "
                            f"is {type(strategy).__name__}; unfreezing at an epoch works on one "
                            f"device and under DDP only: use trainer=gpu, ddp or ddp_cpu, or "
                            f"train the {name} from the start ({self.freeze_key(name)}=false).")

    def connect_data(self, datamodule: Any) -> None:
        """Exchange with a data module what each side owns; check the data fits the model."""
        self.check_audio_limit(datamodule)

    def check_audio_limit(self, datamodule: Any) -> None:
        """The data's ``max_seconds`` must not exceed the encoder's (only the task sees both)."""
        if datamodule.modality != "audio" or self.modality != "audio":
            return
        limit, data_seconds = self.encoder.max_seconds, datamodule.max_seconds
        if limit is not None and (data_seconds is None or data_seconds > limit):
            raise ConfigError(f"data.max_seconds ({data_seconds}) exceeds model.encoder."
                              f"max_seconds ({limit}); set data.max_seconds <= {limit} (clips "
                              f"are cropped to it) or raise model.encoder.max_seconds.")

    def event_parser(self) -> Callable[[str], Any] | None:
        """The caption -> event parser of this run's built-in data set
        (``data.synthetic.kind``), or None. Why: docs/design/synthetic-package.md"""
        from mmtf.synthetic import caption_parser  # at scoring: predicting never loads it

        data = (self.run_config or {}).get("data") or {}
        return caption_parser((data.get("synthetic") or {}).get("kind"))

    def tokenizer_spec(self, spec: dict[str, Any] | None) -> dict[str, Any] | None:
        """The ``tokenizer`` config node this task's run resolves, given the configured one
        (``mmtf.train.connect_tokenizer``): unchanged here; a task whose pretrained part has
        its own tokenizer returns that one's."""
        return spec

    def require_tokenizer(self) -> Tokenizer:
        """The task's tokenizer; a clear error naming the call to make when none was handed over."""
        if self.tokenizer is None:
            raise UserError(f"{type(self).__name__} has no tokenizer; hand it one first: "
                            "task.use_tokenizer(tokenizer) with the tokenizer of "
                            "mmtf.tasks.resolve_tokenizer (a run) or mmtf.tasks.stored_tokenizer"
                            "(checkpoint) (mmtf.tasks.build_task does it).")
        return self.tokenizer

    def check_data_tokenizer(self, datamodule: Any) -> None:
        """The data module builds its ids with this task's tokenizer (tasks that read text).

        A task with a ``chat_template`` (a prefix LLM's) checks the data module renders its
        chats with that same template.

        Raises:
            UserError: either side has no tokenizer, or they differ; the chat templates differ.
        """
        self.require_tokenizer()
        if datamodule.tokenizer is None:
            raise UserError("the data module has no tokenizer; hand it the task's: "
                            "datamodule.connect(task.tokenizer).")
        if datamodule.tokenizer != self.tokenizer:
            raise UserError("the data module builds its ids with another tokenizer than the "
                            "task's; hand both the same one: datamodule.connect(task.tokenizer).")
        template = getattr(self, "chat_template", None)      # a prefix LLM's task
        if template is not None and getattr(datamodule, "chat_template", None) is not template:
            raise UserError("the data module renders its chats with another chat template than "
                            "the task's (or none); hand it the task's: datamodule.connect("
                            "task.tokenizer, **task.text_context()).")

    def text_context(self) -> dict[str, Any]:
        """What the data module needs besides the tokenizer to build this task's ids, handed
        over with it (``datamodule.connect(tokenizer, **context)``): a prefix LM's chat
        template and media placeholder; nothing for the other tasks."""
        return {}

    def predict_batch(self, inputs: torch.Tensor, lengths: torch.Tensor | None,
                      ) -> list[dict[str, Any]]:
        """One result dict per input of the batch (inputs as in a training batch)."""
        raise NotImplementedError

    def generation_state(self) -> Any:
        """The generation settings, to put back with :meth:`restore_generation` after a call
        with its own (:class:`mmtf.predict.model.Model`); None for tasks without any."""
        return None

    def restore_generation(self, state: Any) -> None:
        """Put back settings :meth:`generation_state` returned."""

    def update_generation(self, overrides: dict[str, Any]) -> None:
        """Merge generation settings; only tasks that generate text take any."""
        if overrides:
            raise ConfigError(f"generation.{sorted(overrides)[0]} is set but a "
                              f"{type(self).__name__} checkpoint generates no text; remove the "
                              f"generation.* overrides.")

    def export_parts(self) -> dict[str, nn.Module]:
        """The parts ``mmtf.export`` can write, by the name of their config key under model."""
        return {"encoder": self.encoder}

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> list[dict[str, Any]]:
        return self.predict_batch(*batch_inputs(batch))

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Plain data only (str / dict / list), so the checkpoint loads with weights_only=True.
        checkpoint["mmtf"] = {
            "config": self.run_config,
            "tokenizer": None if self.tokenizer is None else self.tokenizer.to_json_str(),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.run_config = (checkpoint.get("mmtf") or {}).get("config")


def rebuild_ddp(trainer: L.Trainer) -> None:
    """Wrap the trainer's module in a new ``DistributedDataParallel`` (no-op without DDP), so
    its reducer sees unfrozen parameters. Collective: every rank calls it at the same point.
    Why: docs/design/finetuning-controls.md"""
    strategy = trainer.strategy
    if isinstance(strategy, DDPStrategy) and isinstance(strategy.model, DistributedDataParallel):
        strategy.model = strategy.lightning_module     # drops the old wrapper and its reducer
        strategy.configure_ddp()


def batch_inputs(batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The encoder input of a batch: waveforms (b, samples) + lengths, or images (b, 3, h, w);
    a prefix LM's ``media`` with its ``media_mask`` (b, samples) as lengths."""
    if "audio" in batch:
        return batch["audio"], batch["audio_lengths"]
    if "media" in batch:
        mask = batch.get("media_mask")
        return batch["media"], None if mask is None else mask.sum(dim=1)
    if "image" in batch:
        return batch["image"], None
    raise KeyError(f"batch has neither 'audio', 'image' nor 'media' (keys: {sorted(batch)}); the data "
                   f"module's collate must provide one of them.")
