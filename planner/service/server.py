"""`planner serve`: run the service with uvicorn on 127.0.0.1 unless --host says otherwise."""

import argparse
import ipaddress
import os

from rich.console import Console

from planner.errors import InputIssue, PlannerInputError
from planner.service.actions import Limits
from planner.service.sweep_jobs import SweepLimits

__all__ = ["TOKEN_ENV", "serve_command"]

TOKEN_ENV = "PLANNER_SERVE_TOKEN"


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def serve_command(args: argparse.Namespace, console: Console) -> int:
    try:
        import uvicorn

        from planner.service.app import ServiceSettings, create_app
    except ImportError as exc:
        raise PlannerInputError(InputIssue("serve", f"the service needs {exc.name}", "pip install 'llm-deployment-planner[serve]'")) from None
    token = args.token or os.environ.get(TOKEN_ENV) or None
    if not _loopback(args.host) and token is None:
        console.print(f"[yellow]warning[/yellow]: listening on {args.host} without a token: anyone who reaches it can use it "
                      f"(set --token or {TOKEN_ENV})")
    settings = ServiceSettings(token=token, max_body_bytes=args.max_body_bytes, workers=args.workers, backlog=args.backlog,
                               request_timeout_s=args.request_timeout, limits=Limits(time_limit_s=args.time_limit),
                               sweeps=SweepLimits(max_points=args.sweep_points, max_running=args.sweeps, workers=args.sweep_workers,
                                                  ray_address=args.sweep_ray, time_limit_s=args.time_limit))
    console.print(f"planner serve: http://{args.host}:{args.port}/ ({args.workers} workers, {args.backlog} waiting at most"
                  f"{', bearer token required' if token else ''})", markup=False)
    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level="warning",
                limit_concurrency=8 * (args.workers + args.backlog) + 16, timeout_keep_alive=5)
    return 0
