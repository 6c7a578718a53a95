"""The calculator as verl's tools (``task.tool_config: tool_config.yaml``, verl's ``multi_turn.tool_config_path``):
a class with verl's ``BaseTool`` methods, made once per entry of the config, whose calls each run ``create`` (with
the row's ``extra_info.tools_kwargs``), ``execute`` and ``release``, as verl's tool agent runs them.

A subclass of verl's own ``BaseTool`` (``from verl.tools.base_tool import BaseTool``) returning verl's
``ToolResponse`` runs the same way where verl is installed; this one needs nothing of verl, so it returns plain text
(as verl's older tools did)."""

from __future__ import annotations

import uuid


class CalculatorTool:
    def __init__(self, config: dict, tool_schema):
        self.config, self.tool_schema = config, tool_schema
        self.name = tool_schema.function.name
        self.op = config["op"]  # "add" or "multiply": one entry of tool_config.yaml each
        self._instances: dict[str, dict] = {}

    def get_openai_tool_schema(self):
        return self.tool_schema

    async def create(self, instance_id: str | None = None, **kwargs) -> tuple[str, None]:
        """One call's state; the row's ``extra_info.tools_kwargs[<name>].create_kwargs`` arrive as ``create_kwargs``."""
        instance_id = instance_id or uuid.uuid4().hex
        self._instances[instance_id] = {"ground_truth": kwargs.get("create_kwargs", {}).get("ground_truth")}
        return instance_id, None

    async def execute(self, instance_id: str, parameters: dict, **kwargs) -> tuple[str, float, dict]:
        """The result's text, the step's reward (1 when the result is the row's answer, given one), metrics."""
        a, b = int(parameters["a"]), int(parameters["b"])
        value = a + b if self.op == "add" else a * b
        truth = self._instances[instance_id]["ground_truth"]
        return str(value), float(truth is not None and str(value) == str(truth)), {}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs) -> None:
        self._instances.pop(instance_id, None)
