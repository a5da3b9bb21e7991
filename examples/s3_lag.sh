# Sourced by the S3 examples: starts moto (MOTO_SERVER, default the one
# .ci/run installs) behind a proxy that delays every request a client sends
# by LAG_MS, points the AWS_* variables at the proxy, and stops both on
# exit. Sets `work` (a scratch directory, removed on exit) and `port`
# (moto's own port, for creating buckets without the lag).
MOTO_SERVER=${MOTO_SERVER:-$HOME/.cache/memwal-ci-venv/bin/moto_server}
work=$(mktemp -d)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port) lag_port=$(free_port)
"$MOTO_SERVER" -H 127.0.0.1 -p "$port" >"$work/moto.log" 2>&1 &
moto=$!
# The latency: every chunk a client sends (a request) waits LAG_MS.
python3 - "$lag_port" "$port" "$LAG_MS" >"$work/proxy.log" 2>&1 <<'PY' &
import asyncio, sys
listen, target, lag = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]) / 1000
async def pipe(r, w, delay):
    try:
        while data := await r.read(65536):
            if delay:
                await asyncio.sleep(delay)
            w.write(data)
            await w.drain()
    except Exception:
        pass
    finally:
        w.close()
async def client(cr, cw):
    sr, sw = await asyncio.open_connection("127.0.0.1", target)
    await asyncio.gather(pipe(cr, sw, lag), pipe(sr, cw, 0))
async def main():
    async with await asyncio.start_server(client, "127.0.0.1", listen) as server:
        await server.serve_forever()
asyncio.run(main())
PY
proxy=$!
trap 'kill $moto $proxy 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do curl -s "http://127.0.0.1:$port/" >/dev/null 2>&1 && break; sleep 0.2; done
export AWS_ENDPOINT="http://127.0.0.1:$lag_port" AWS_ALLOW_HTTP=true AWS_REGION=us-east-1
export AWS_ACCESS_KEY_ID=memwal AWS_SECRET_ACCESS_KEY=memwal
