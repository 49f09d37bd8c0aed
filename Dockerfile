# Multi-stage build of a static, non-root hub image.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The server alone: the demo (cmd/hubdemo) and its workloads are not in it.
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/hub ./cmd/hub

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/hub /hub
USER 65532:65532
EXPOSE 15010 15012 8080 8443
ENTRYPOINT ["/hub", "serve"]
