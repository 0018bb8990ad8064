"""A sweep's prompts: exact-length prompts per (context, repetition), cold ones for a
prefill measurement, a workload file's requests, and the request bodies made of them."""

from __future__ import annotations

from speedmatrix.sweep.server import SweepServer


def sent_its_prompts(cell: dict) -> bool:
    """Whether a stored cell sent its context's decode prompts to the server: any decode
    cell but those never run (over capacity, or left when the server was lost)."""
    return (
        cell.get("phase") == "decode"
        and not cell.get("not_run")
        and cell.get("status") != "over_capacity"
    )


class SweepPrompts(SweepServer):
    """Prompts and request bodies of a cell."""

    def _prompts(self, context: int, count: int, repetition: int, *, cold: bool = False, cell):
        """`count` prompts of exactly `context` tokens.

        The decode cells of one context share their prompts (each cell's warm-up warms
        the prefix cache anyway). A prefill measurement (`cold`) gets prompts the server
        has never seen, shared prefix included: a factory of its own, salted with this
        process's nonce and a counter, so that neither an earlier cell (concurrency
        given in descending order), an earlier repetition, nor the part of a run before
        `--resume` sent them, and the prefill is not served from the prefix cache."""
        from speedmatrix.prompts import PromptFactory

        run_seed = self.doc["meta"]["run"]["seed"]
        if cold:
            self._cold_prompts += 1
            seed: int | str = (
                f"{run_seed}/{context}/{repetition}/cold/{self._nonce}/{self._cold_prompts}"
            )
            factory = self._factory(PromptFactory, cell, seed)
            return factory.prompts(count)
        key = (context, repetition)
        cache = self.__dict__.setdefault("_prompt_factories", {})
        if key not in cache:
            cache[key] = self._factory(
                PromptFactory, cell, hash((run_seed, context, repetition)) & 0xFFFFFFFF
            )
        return cache[key].prompts(count)

    def _prompts_sent(self, context: int, repetition: int) -> bool:
        """Whether the server may have seen the decode prompts of (context, repetition):
        made in this process, or a cell of theirs stored before a `--resume` (any cell
        but those never run: over capacity, or left when the server was lost)."""
        if (context, repetition) in self.__dict__.get("_prompt_factories", {}):
            return True
        return any(
            sent_its_prompts(c)
            and c.get("context") == context
            and c.get("repetition", 0) == repetition
            for c in self.cells.values()
        )

    def _factory(self, factory_cls, cell, seed: int | str):
        return factory_cls(
            self.target,
            cell.context,
            api=cell.api,
            shared_prefix=cell.shared_prefix,
            seed=seed,
            tokenizer=self.tokenizer,
        )

    def _bodies(self, cell, prompts, max_tokens: int) -> list[bytes]:
        from speedmatrix.prompts import request_body

        return [
            request_body(self.target, cell.api, p, max_tokens, extra=cell.extra) for p in prompts
        ]

    def _file_bodies(self, cell) -> list[bytes]:
        """The bodies of a workload file's requests (`speedmatrix.workload`), in file order,
        each with its own max_tokens (else the cell's); loaded once per run."""
        from speedmatrix.prompts import request_body
        from speedmatrix.workload import load_prompts

        cache = self.__dict__.setdefault("_file_prompts", {})
        if cell.prompts_file not in cache:
            cache[cell.prompts_file] = load_prompts(cell.prompts_file)
        return [
            request_body(
                self.target,
                cell.api,
                p.payload,
                p.max_tokens or cell.max_output,
                extra=cell.extra,
            )
            for p in cache[cell.prompts_file]
        ]
