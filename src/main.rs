fn main() {
    println!("nodelet");
}
