"""Request router for vLLM prefill/decode pools joined by the NIXL KV connector; shipped by the vLLM
exports (launch scripts and Kubernetes manifests) and run as `python3 vllm_pd_router.py ...`.

It needs only what the vLLM image installs (fastapi, httpx, uvicorn). Each request goes first to a
prefill server with one output token and `kv_transfer_params.do_remote_decode` set; the prefill server
answers with the `kv_transfer_params` that locate its KV cache, and the request then goes to a decode
server with those parameters, which reads the cache over NIXL and generates the answer, streamed back
as it comes (vLLM docs/features/nixl_connector_usage.md describes the two requests). Servers are taken
round-robin; `/healthcheck` answers once the router is up.
"""

import argparse
import itertools

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

__all__ = ["main", "make_app", "parser"]

REMOTE_DECODE = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                 "remote_block_ids": None, "remote_host": None, "remote_port": None}
TIMEOUT_S = None  # a long prompt's prefill or a long answer has no natural bound


def make_app(prefill_urls: list[str], decode_urls: list[str]) -> FastAPI:
    """The router's application: every completion endpoint goes prefill first, then decode."""
    app, prefill, decode = FastAPI(), itertools.cycle(prefill_urls), itertools.cycle(decode_urls)
    app.state.client = httpx.AsyncClient(timeout=TIMEOUT_S)

    @app.get("/healthcheck")
    async def healthcheck() -> dict:
        return {"status": "ok", "prefill": len(prefill_urls), "decode": len(decode_urls)}

    async def forward(path: str, request: Request) -> Response:
        body, client = await request.json(), app.state.client
        first = {**body, "kv_transfer_params": dict(REMOTE_DECODE), "stream": False, "max_tokens": 1}
        first.pop("stream_options", None)
        if "max_completion_tokens" in body:
            first["max_completion_tokens"] = 1
        answer = await client.post(f"{next(prefill)}{path}", json=first)
        if answer.status_code != 200:
            return Response(answer.content, status_code=answer.status_code, media_type=answer.headers.get("content-type"))
        second = {**body, "kv_transfer_params": answer.json().get("kv_transfer_params")}
        reply = await client.send(client.build_request("POST", f"{next(decode)}{path}", json=second), stream=True)
        if not body.get("stream"):
            content = await reply.aread()
            await reply.aclose()
            return Response(content, status_code=reply.status_code, media_type=reply.headers.get("content-type"))

        async def chunks():
            try:
                async for chunk in reply.aiter_bytes():
                    yield chunk
            finally:
                await reply.aclose()
        return StreamingResponse(chunks(), status_code=reply.status_code, media_type=reply.headers.get("content-type"))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await forward("/v1/completions", request)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await forward("/v1/chat/completions", request)

    @app.get("/v1/models")
    async def models() -> Response:
        answer = await app.state.client.get(f"{decode_urls[0]}/v1/models")
        return JSONResponse(answer.json(), status_code=answer.status_code)

    return app


def _urls(hosts: list[str], ports: list[str], flag: str) -> list[str]:
    if len(hosts) != len(ports) or not hosts:
        raise SystemExit(f"{flag}-hosts and {flag}-ports need one port per host")
    return [f"http://{h}:{p}" for h, p in zip(hosts, ports)]


def parser() -> argparse.ArgumentParser:
    """The router's command line (the exports write it; the tests parse every one they write)."""
    out = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    out.add_argument("--host", default="0.0.0.0")
    out.add_argument("--port", type=int, default=8192)
    for side in ("prefiller", "decoder"):
        out.add_argument(f"--{side}-hosts", nargs="+", required=True)
        out.add_argument(f"--{side}-ports", nargs="+", required=True)
    return out


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    app = make_app(_urls(args.prefiller_hosts, args.prefiller_ports, "--prefiller"),
                   _urls(args.decoder_hosts, args.decoder_ports, "--decoder"))
    uvicorn.run(app, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
