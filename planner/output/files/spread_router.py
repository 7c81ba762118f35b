"""Request router over a workload's aggregated replicas; shipped by the vLLM and TensorRT-LLM launch
scripts (SGLang's use SGLang's own router) and run as `python3 spread_router.py ...`.

It needs only fastapi, httpx and uvicorn, as the prefill/decode router beside it does (vLLM's server and
trtllm-serve are fastapi applications run by uvicorn). Each request goes to the replica with the fewest
requests in flight for the batch the plan sized it for (`--server-batches`: replicas of one workload may
run on different racks with different batches), the first such replica on a tie, so that every replica
fills towards its planned batch together; answers are streamed back as they come. `/health` answers once
the router is up.
"""

import argparse

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

__all__ = ["Spread", "main", "make_app", "parser"]

TIMEOUT_S = None  # a long prompt's prefill or a long answer has no natural bound


class Spread:
    """Requests in flight per server; `take` picks the least loaded relative to its planned batch."""

    def __init__(self, urls: list[str], batches: list[int]) -> None:
        self.urls, self.batches, self.in_flight = urls, batches, [0] * len(urls)

    def take(self) -> int:
        i = min(range(len(self.urls)), key=lambda k: (self.in_flight[k] / self.batches[k], k))
        self.in_flight[i] += 1
        return i

    def done(self, i: int) -> None:
        self.in_flight[i] -= 1


def make_app(urls: list[str], batches: list[int]) -> FastAPI:
    """The router's application: every completion endpoint goes to one replica, chosen by `Spread`."""
    app, spread = FastAPI(), Spread(urls, batches)
    app.state.client, app.state.spread = httpx.AsyncClient(timeout=TIMEOUT_S), spread

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "servers": len(urls)}

    async def forward(path: str, request: Request) -> Response:
        body, client, i = await request.json(), app.state.client, spread.take()
        try:
            reply = await client.send(client.build_request("POST", f"{urls[i]}{path}", json=body), stream=True)
        except BaseException:
            spread.done(i)
            raise
        if not body.get("stream"):
            try:
                content = await reply.aread()
            finally:
                await reply.aclose()
                spread.done(i)
            return Response(content, status_code=reply.status_code, media_type=reply.headers.get("content-type"))

        async def chunks():
            try:
                async for chunk in reply.aiter_bytes():
                    yield chunk
            finally:
                await reply.aclose()
                spread.done(i)
        return StreamingResponse(chunks(), status_code=reply.status_code, media_type=reply.headers.get("content-type"))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await forward("/v1/completions", request)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await forward("/v1/chat/completions", request)

    @app.get("/v1/models")
    async def models() -> Response:
        answer = await app.state.client.get(f"{urls[0]}/v1/models")
        return JSONResponse(answer.json(), status_code=answer.status_code)

    return app


def parser() -> argparse.ArgumentParser:
    """The router's command line (the exports write it; the tests parse every one they write)."""
    out = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    out.add_argument("--host", default="0.0.0.0")
    out.add_argument("--port", type=int, default=8192)
    out.add_argument("--server-hosts", nargs="+", required=True)
    out.add_argument("--server-ports", nargs="+", type=int, required=True)
    out.add_argument("--server-batches", nargs="+", type=int, required=True)
    return out


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if not len(args.server_hosts) == len(args.server_ports) == len(args.server_batches) or min(args.server_batches) < 1:
        raise SystemExit("--server-hosts, --server-ports and --server-batches need one entry per server, batches >= 1")
    urls = [f"http://{h}:{p}" for h, p in zip(args.server_hosts, args.server_ports)]
    uvicorn.run(make_app(urls, args.server_batches), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
