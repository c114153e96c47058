//! Where the Java peers (Apache Curator on Debian's jars) find their classes: shared by the
//! interoperability tests and `distlock bench --curator`.

/// Debian's jars that Curator 5 and its ZooKeeper client need (packages
/// `libcurator-recipes-java`, `libslf4j-java` and `zookeeper`).
pub const CURATOR_JARS: &[&str] = &[
    "curator-client",
    "curator-framework",
    "curator-recipes",
    "zookeeper",
    "zookeeper-jute",
    "guava",
    "slf4j-api",
    "slf4j-nop",
    "netty-handler",
    "netty-transport",
    "netty-common",
    "netty-buffer",
    "netty-resolver",
    "netty-codec",
    "netty-transport-native-epoll",
    "netty-transport-native-unix-common",
];

/// The Java class path of [`CURATOR_JARS`] under `/usr/share/java`, or the first jar missing.
///
/// # Examples
///
/// ```no_run
/// match distlock_faults::peers::curator_classpath() {
///     Ok(cp) => println!("java -cp {cp} ..."),
///     Err(missing) => eprintln!("{missing} is missing"),
/// }
/// ```
pub fn curator_classpath() -> Result<String, String> {
    let mut jars = Vec::new();
    for j in CURATOR_JARS {
        let p = format!("/usr/share/java/{j}.jar");
        if !std::path::Path::new(&p).exists() {
            return Err(p);
        }
        jars.push(p);
    }
    Ok(jars.join(":"))
}
