# autopush-ts: one image for every process; the command picks which (docker-compose.yml).
#
#   docker build -t autopush-ts .
#   docker run --rm autopush-ts node src/bin/autokey.ts                      # a new CRYPTO_KEY
#   docker run -p 8080:8080 -p 8082:8082 autopush-ts                         # all-in-one, embedded storage
#   docker run -e CRYPTO_KEY=… -e AUTOPUSH__STORAGE_ENDPOINT=… autopush-ts node src/bin/autoconnect.ts
#
# The base image's Node 24 strips the types of the .ts sources itself: there is no build step.
FROM node:24-slim

WORKDIR /app
ENV NODE_ENV=production

# Dependencies first, so that a change to the sources does not reinstall them. Without install
# scripts: the `node` package (which pins Node 24 for checkouts on an older Node) would download a
# second Node; this image runs on its own. No other dependency needs a script (LevelDB, under the
# embedded storage, ships prebuilt binaries).
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --ignore-scripts && npm cache clean --force

COPY bin ./bin
COPY src ./src
COPY config ./config
# Its "Errors" section is served as GET /errors (what every error's more_info names).
COPY README.md ./

# The all-in-one keeps its embedded data and generated keys under ./data (mount a volume there).
RUN mkdir -p /app/data && chown node:node /app/data
VOLUME ["/app/data"]

ARG AUTOPUSH_COMMIT=unknown
ENV AUTOPUSH_COMMIT=$AUTOPUSH_COMMIT AUTOPUSH_BUILD=docker

USER node
# 8080 WebSocket (public), 8081 router (private: endpoint nodes only), 8082 Web Push HTTP API and web console (public)
EXPOSE 8080 8081 8082
CMD ["node", "src/bin/autopush.ts"]
