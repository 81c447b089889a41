use super::*;

async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut buffer = [0u8; 64];
                while let Ok(n) = socket.read(&mut buffer).await {
                    if n == 0 || socket.write_all(&buffer[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

async fn round_trip(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    stream.write_all(b"ping").await?;
    let mut reply = [0u8; 4];
    stream.read_exact(&mut reply).await?;
    Ok(reply.to_vec())
}

#[tokio::test]
async fn forwards_then_cuts_then_heals() {
    let proxy = Proxy::start(echo_server().await).await.unwrap();
    let mut open = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(round_trip(&mut open).await.unwrap(), b"ping");

    proxy.set_cut(true);
    // The open connection is severed, and a new one gets no answer.
    assert!(round_trip(&mut open).await.is_err());
    let mut refused = TcpStream::connect(proxy.addr()).await.unwrap();
    assert!(round_trip(&mut refused).await.is_err());

    proxy.set_cut(false);
    let mut healed = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(round_trip(&mut healed).await.unwrap(), b"ping");
}

#[tokio::test]
async fn latency_delays_each_direction() {
    let proxy = Proxy::start(echo_server().await).await.unwrap();
    proxy.set_latency(Duration::from_millis(100));
    let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
    let started = tokio::time::Instant::now();
    assert_eq!(round_trip(&mut stream).await.unwrap(), b"ping");
    // Once on the way in and once on the way out: a lower bound, never flaky.
    assert!(started.elapsed() >= Duration::from_millis(200));
}

#[tokio::test]
async fn a_stall_holds_the_bytes_until_it_is_lifted() {
    let proxy = Proxy::start(echo_server().await).await.unwrap();
    let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(round_trip(&mut stream).await.unwrap(), b"ping");

    proxy.set_stalled(true);
    let silent = tokio::time::timeout(Duration::from_millis(300), round_trip(&mut stream)).await;
    assert!(silent.is_err(), "an answer came through the stall");

    proxy.set_stalled(false);
    // The held request goes through, on the same connection.
    let mut reply = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut reply))
        .await
        .expect("the held bytes arrive")
        .unwrap();
    assert_eq!(&reply, b"ping");
}
