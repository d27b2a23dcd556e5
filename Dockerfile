# One image for every process of the federation: the four tier servers and the router.
# The command picks the role: `serve working|episodic|semantic|procedural|router`.
#   docker build -t a2m-router .
#   docker run --rm -p 8700:8700 a2m-router            # the router (expects its tiers)
#   docker run --rm a2m-router serve working --url redis://redis:6379/0
FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/a2m
WORKDIR /src
# Dependencies first, so a source change does not reinstall them.
COPY pyproject.toml README.md ./
RUN mkdir -p a2m backends router a2mctl \
    && touch a2m/__init__.py backends/__init__.py router/__init__.py a2mctl/__init__.py \
    && /opt/a2m/bin/pip install '.[otel]' \
    && /opt/a2m/bin/pip uninstall -y a2m-router
COPY a2m ./a2m
COPY backends ./backends
COPY router ./router
COPY a2mctl ./a2mctl
RUN /opt/a2m/bin/pip install --no-deps . && /opt/a2m/bin/a2m --help >/dev/null

FROM python:3.11-slim
# git: the procedural tier's engine (GitPython drives the git binary).
RUN apt-get update \
    && apt-get install -y --no-install-recommends git ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --create-home --shell /usr/sbin/nologin a2m \
    && mkdir -p /data && chown a2m:a2m /data
COPY --from=build /opt/a2m /opt/a2m
ENV PATH=/opt/a2m/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    A2M_HOST=0.0.0.0 \
    A2M_PORT=8700 \
    A2M_DATA=/data
USER 10001
WORKDIR /data
VOLUME ["/data"]
EXPOSE 8700 8701 8702 8703 8704
# Ready means the engine answers (a tier) or the default tier does (the router).
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('A2M_PORT', '8700'), timeout=2)"
ENTRYPOINT ["a2m"]
CMD ["serve", "router"]
