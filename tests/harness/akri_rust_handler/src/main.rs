//! akri-rust-handler: a discovery handler on Akri's protocol, in Rust, for edgeplug's tests.
//!
//! It stands for Akri's own handlers (debugEcho, udev, ...), which are Rust programs serving
//! gRPC with upstream tonic over hyper and h2. h2 checks every request's `:authority` as
//! RFC 9113 asks, which grpc-go's server does not: a client that sends a socket path there is
//! refused with RST_STREAM (PROTOCOL_ERROR) before this program sees the call.
//!
//! Like the Go test handler, it finds the agent through DISCOVERY_HANDLERS_DIRECTORY, registers
//! over agent-registration.sock, serves DiscoveryHandler on `<directory>/<name>.sock` and
//! registers again whenever the agent drops one of its Discover streams.
//!
//! Details (YAML, debugEcho's own plus one key):
//!
//!   descriptions: [foo0, foo1]  # one device per description; id = description
//!   fail: true                  # answer Discover with INVALID_ARGUMENT instead
//!
//! `-refuse=MESSAGE` answers every Discover with INVALID_ARGUMENT MESSAGE, whatever the
//! details: a handler that is there and never serves (a Configuration's details it
//! cannot take, or a bug of its own).
//!
//! `-socket=PATH` serves on PATH instead of `<directory>/<name>.sock` (a second handler of one
//! name); `-prefix=P` puts P before every device id (its devices differ from another's).
//!
//! Each device carries DEBUG_ECHO_DESCRIPTION and HANDLER_STACK=rust-tonic, so a test can tell
//! whose list the agent serves.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, Notify};
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::transport::{Endpoint, Server, Uri};
use tonic::{Request, Response, Status};
use yaml_rust2::YamlLoader;

pub mod v0 {
    tonic::include_proto!("v0");
}

use v0::discovery_handler_server::{DiscoveryHandler, DiscoveryHandlerServer};
use v0::register_discovery_handler_request::EndpointType;
use v0::registration_client::RegistrationClient;
use v0::{DiscoverRequest, DiscoverResponse, RegisterDiscoveryHandlerRequest};

const REGISTRATION_SOCKET: &str = "agent-registration.sock";
const REGISTER_RETRY: Duration = Duration::from_millis(200);
const REGISTER_DEADLINE: Duration = Duration::from_secs(30);

struct Details {
    descriptions: Vec<String>,
    fail: bool,
}

fn parse(text: &str) -> Result<Details, String> {
    let docs = YamlLoader::load_from_str(text).map_err(|e| e.to_string())?;
    let mut details = Details { descriptions: Vec::new(), fail: false };
    if let Some(doc) = docs.first() {
        if let Some(items) = doc["descriptions"].as_vec() {
            for item in items {
                let desc = item.as_str().ok_or("descriptions holds a non-string")?;
                details.descriptions.push(desc.to_string());
            }
        }
        details.fail = doc["fail"].as_bool().unwrap_or(false);
    }
    Ok(details)
}

struct Handler {
    dropped: Arc<Notify>, // a Discover stream ended: register again, as Akri's handlers do
    refuse: Option<String>,
    prefix: String,
}

type Lists = ReceiverStream<Result<DiscoverResponse, Status>>;

#[tonic::async_trait]
impl DiscoveryHandler for Handler {
    type DiscoverStream = Lists;

    async fn discover(
        &self,
        request: Request<DiscoverRequest>,
    ) -> Result<Response<Lists>, Status> {
        let details = parse(&request.get_ref().discovery_details)
            .map_err(|e| Status::invalid_argument(format!("discoveryDetails: {e}")))?;
        eprintln!("discover called: {:?}", details.descriptions);
        if let Some(message) = &self.refuse {
            return Err(Status::invalid_argument(message.clone()));
        }
        if details.fail {
            return Err(Status::invalid_argument("discoveryDetails asks this handler to fail"));
        }
        let devices = details
            .descriptions
            .iter()
            .map(|desc| v0::Device {
                id: format!("{}{desc}", self.prefix),
                properties: [
                    ("DEBUG_ECHO_DESCRIPTION".to_string(), desc.clone()),
                    ("HANDLER_STACK".to_string(), "rust-tonic".to_string()),
                ]
                .into(),
                mounts: Vec::new(),
                device_specs: Vec::new(),
            })
            .collect();
        let (tx, rx) = mpsc::channel(1);
        tx.send(Ok(DiscoverResponse { devices }))
            .await
            .map_err(|_| Status::cancelled("the agent went"))?;
        let dropped = self.dropped.clone();
        tokio::spawn(async move {
            tx.closed().await; // the list never changes: hold the stream until the agent goes
            dropped.notify_one();
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

async fn register(dir: &Path, req: &RegisterDiscoveryHandlerRequest) -> Result<(), String> {
    let socket = dir.join(REGISTRATION_SOCKET);
    let deadline = Instant::now() + REGISTER_DEADLINE;
    loop {
        let result = register_once(socket.clone(), req.clone()).await;
        if result.is_ok() || Instant::now() > deadline {
            return result;
        }
        tokio::time::sleep(REGISTER_RETRY).await;
    }
}

async fn register_once(socket: PathBuf, req: RegisterDiscoveryHandlerRequest) -> Result<(), String> {
    // The URI only names the authority sent; the connector dials the agent's socket.
    let channel = Endpoint::from_static("http://localhost")
        .connect_timeout(Duration::from_secs(2))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(socket).await?)) }
        }))
        .await
        .map_err(|e| e.to_string())?;
    let mut client = RegistrationClient::new(channel);
    let mut request = Request::new(req);
    request.set_timeout(Duration::from_secs(2));
    client.register_discovery_handler(request).await.map_err(|e| e.to_string())?;
    Ok(())
}

#[tokio::main]
async fn main() {
    let mut name = "debugEcho".to_string();
    let mut shared = true;
    let mut refuse = None;
    let mut socket = None;
    let mut prefix = String::new();
    for arg in std::env::args().skip(1) {
        if let Some(value) = arg.strip_prefix("-name=") {
            name = value.to_string();
        } else if let Some(value) = arg.strip_prefix("-shared=") {
            shared = value == "true";
        } else if let Some(value) = arg.strip_prefix("-refuse=") {
            refuse = Some(value.to_string());
        } else if let Some(value) = arg.strip_prefix("-socket=") {
            socket = Some(PathBuf::from(value));
        } else if let Some(value) = arg.strip_prefix("-prefix=") {
            prefix = value.to_string();
        } else {
            eprintln!("unknown argument {arg:?} (takes -name= -shared=true|false -refuse= \
                       -socket= -prefix=)");
            std::process::exit(2);
        }
    }
    let dir = match std::env::var("DISCOVERY_HANDLERS_DIRECTORY") {
        Ok(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => {
            eprintln!("DISCOVERY_HANDLERS_DIRECTORY is not set");
            std::process::exit(1);
        }
    };
    let path = socket.unwrap_or_else(|| dir.join(format!("{name}.sock")));
    let _ = std::fs::remove_file(&path); // a previous run's socket
    let listener = UnixListener::bind(&path).unwrap_or_else(|e| {
        eprintln!("listen on {}: {e}", path.display());
        std::process::exit(1);
    });
    let dropped = Arc::new(Notify::new());
    let handler = Handler { dropped: dropped.clone(), refuse, prefix };
    tokio::spawn(async move {
        let served = Server::builder()
            .add_service(DiscoveryHandlerServer::new(handler))
            .serve_with_incoming(UnixListenerStream::new(listener))
            .await;
        if let Err(e) = served {
            eprintln!("serve: {e}");
            std::process::exit(1);
        }
    });
    let req = RegisterDiscoveryHandlerRequest {
        name: name.clone(),
        endpoint: path.display().to_string(),
        endpoint_type: EndpointType::Uds as i32,
        shared,
    };
    if let Err(e) = register(&dir, &req).await {
        eprintln!("register: {e}");
        std::process::exit(1);
    }
    eprintln!("registered {:?} at {}", req.name, req.endpoint);
    loop {
        dropped.notified().await;
        match register(&dir, &req).await {
            Ok(()) => eprintln!("registered {:?} at {} again", req.name, req.endpoint),
            Err(e) => eprintln!("registering again: {e}"),
        }
    }
}
