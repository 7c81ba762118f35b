"""`planner serve`: the planner over HTTP (JSON endpoints under /v1/) and a web page at `/`.

The service sits downstream of the command line: every endpoint parses its options with the CLI's
own argument parser, calls the same library functions and answers with the same JSON records the
CLI writes (planner/service/actions.py); the web page (planner/service/static/) only draws them.
Needs the optional extra: pip install 'llm-deployment-planner[serve]'.
"""
